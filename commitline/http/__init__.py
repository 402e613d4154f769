"""The HTTP API (``commitline serve``): commands with Idempotency-Key, reads, health, metrics and the
status page, over the same composition root as the CLI. An entry point: it only calls ``bootstrap()``'s
``Commitline`` and renders what it returns."""
