"""Read models built by followers of the notification log, never by the command path."""
