"""The exception of ours an ``eventsourcing`` caller may meet; every other failure is already one of
eventsourcing's types (``IntegrityError``, ``OperationalError``, ...): the recorders use the library's
own connection wrapper, which translates psycopg's errors."""

from __future__ import annotations

from eventsourcing.persistence import IntegrityError


class IdempotencyKeyUsed(IntegrityError):
    """An insert named an idempotency key that is already recorded: nothing of it was written."""

    def __init__(self, key: str):
        super().__init__(f"idempotency key {key!r} is already recorded; nothing was written")
        self.key = key
