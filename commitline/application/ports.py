"""What the application needs from storage, stated as a protocol the infrastructure fulfils."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar
from uuid import UUID

from commitline.domain import Aggregate, Event

A = TypeVar("A", bound=Aggregate)


class StreamMoved(Exception):
    """Raised by ``append`` when another writer already took a version being appended."""


class KeyAlreadyRecorded(Exception):
    """Raised by ``append`` when the idempotency key was committed by a concurrent twin."""


@dataclass(frozen=True)
class IdempotencyRecord:
    """What a key stands for: the request's fingerprint and the outcome it produced."""

    tenant: str
    key: str
    fingerprint: bytes
    command_type: str
    aggregate_id: UUID
    stream_version: int
    outcome: bytes


class EventStore(Protocol):
    def load(self, cls: type[A], aggregate_id: UUID) -> A:
        """The aggregate as of its latest event; a blank one (version 0) if it has none."""

    def append(
        self, aggregate: Aggregate, events: Sequence[Event], *, tenant: str, idempotency: IdempotencyRecord | None
    ) -> None:
        """Atomically store the events and the idempotency record, or raise StreamMoved/KeyAlreadyRecorded
        (or EventTooLarge, before writing anything)."""

    def find_outcome(self, tenant: str, key: str) -> IdempotencyRecord | None: ...

    def stream_version(self, aggregate_id: UUID) -> int: ...
