"""Error type shared by the embedded test/dev services.

Owns :class:`EmbeddedServiceError`, raised by
:mod:`commitline.infrastructure.embedded.postgres` (with its ``postgres_binaries``
and ``postmaster``) and :mod:`commitline.infrastructure.embedded.kafka` when a throwaway server cannot
be started (or stopped) — the message carries the tail of the server's own log
so the cause is visible without digging through temp folders.
"""

from __future__ import annotations


class EmbeddedServiceError(RuntimeError):
    """An embedded PostgreSQL or Kafka-protocol server failed to start or stop."""
