"""Small domains for tests of the framework itself: broken ones, evolving ones."""
