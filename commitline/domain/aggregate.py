"""The aggregate and event base classes: immutable events, state rebuilt by applying them.

An aggregate never performs I/O. Command methods check the rules, then ``_emit`` an
event; ``apply`` is the only place state changes, so replaying stored events through
``apply`` rebuilds exactly the state the commands produced.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar, Self
from uuid import UUID, uuid4


@dataclass(frozen=True, kw_only=True)
class Event:
    """Something that happened to one aggregate. Subclasses add the payload fields.

    ``class_version`` and ``upcast_vN_vM`` static methods on a subclass evolve old
    stored payloads to the current shape; history is never rewritten.
    """

    event_id: UUID
    aggregate_id: UUID
    version: int
    occurred_at: datetime

    class_version: ClassVar[int] = 1
    ENVELOPE: ClassVar[frozenset[str]] = frozenset({"event_id", "aggregate_id", "version", "occurred_at"})

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__

    def payload(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.ENVELOPE}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(kw_only=True)
class Aggregate:
    """Base of every aggregate. Fields declared by subclasses are the whole state."""

    id: UUID
    version: int = 0

    EVENTS: ClassVar[tuple[type[Event], ...]] = ()

    @classmethod
    def blank(cls, aggregate_id: UUID) -> Self:
        """The aggregate before its first event: every field at its default."""
        return cls(id=aggregate_id)

    @classmethod
    def replay(cls, aggregate_id: UUID, events: list[Event], start: Self | None = None) -> Self:
        aggregate = start if start is not None else cls.blank(aggregate_id)
        for event in events:
            aggregate.apply(event)
        return aggregate

    @property
    def exists(self) -> bool:
        return self.version > 0

    def fsm_states(self) -> dict[str, str]:
        """The current state of each finite-state machine in this aggregate, by machine name."""
        return {}

    def apply(self, event: Event) -> None:
        if event.version != self.version + 1:
            raise ValueError(
                f"{type(self).__name__} {self.id}: event version {event.version} does not follow {self.version}"
            )
        self._evolve(event)
        self.version = event.version

    def _evolve(self, event: Event) -> None:
        raise NotImplementedError

    def _emit(self, event_type: type[Event], **payload: Any) -> None:
        event = event_type(
            event_id=uuid4(), aggregate_id=self.id, version=self.version + 1, occurred_at=utcnow(), **payload
        )
        self.apply(event)
        self._pending().append(event)

    def _pending(self) -> list[Event]:
        # Kept outside the dataclass fields so snapshots and equality see state only.
        return self.__dict__.setdefault("_pending_events", [])

    def collect_events(self) -> list[Event]:
        pending = self._pending()
        events = list(pending)
        pending.clear()
        return events
