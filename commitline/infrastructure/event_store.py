"""The application's ``EventStore`` on PostgreSQL: loading aggregates (snapshot + replay),
appending their events, idempotency records, and taking snapshots of long streams."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar
from uuid import UUID

from commitline.application.errors import WrongAggregateType
from commitline.application.ports import IdempotencyRecord
from commitline.domain import Aggregate, Event
from commitline.infrastructure.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from commitline.infrastructure.recorder import EventRecorder, Snapshot

A = TypeVar("A", bound=Aggregate)
log = logging.getLogger(__name__)


class PostgresEventStore:
    def __init__(self, recorder: EventRecorder, snapshot_interval: int = 100):
        self.recorder = recorder
        self.snapshot_interval = snapshot_interval

    def load(self, cls: type[A], aggregate_id: UUID, *, use_snapshot: bool = True) -> A:
        snapshot, stored = self.recorder.load_stream(aggregate_id, after_snapshot=use_snapshot and self.snapshot_interval > 0)
        start: A | None = None
        if snapshot is not None:
            if snapshot.aggregate_type != cls.__name__:
                raise WrongAggregateType(aggregate_id, cls.__name__, snapshot.aggregate_type)
            start = decode_snapshot(cls, snapshot.state)  # type: ignore[assignment]
        recorded = [decode_event(s.topic, s.originator_id, s.originator_version, s.state) for s in stored]
        if recorded and recorded[0].aggregate_type != cls.__name__:
            raise WrongAggregateType(aggregate_id, cls.__name__, recorded[0].aggregate_type)
        return cls.replay(aggregate_id, [r.event for r in recorded], start)

    def append(
        self, aggregate: Aggregate, events: Sequence[Event], *, tenant: str, idempotency: IdempotencyRecord | None
    ) -> None:
        self.recorder.append([encode_event(e, tenant) for e in events], idempotency)
        if self._snapshot_due(aggregate.version - len(events), aggregate.version):
            self._take_snapshot(aggregate)

    def find_outcome(self, tenant: str, key: str) -> IdempotencyRecord | None:
        return self.recorder.find_idempotency(tenant, key)

    def stream_version(self, aggregate_id: UUID) -> int:
        return self.recorder.stream_version(aggregate_id)

    def _snapshot_due(self, before: int, after: int) -> bool:
        n = self.snapshot_interval
        return n > 0 and after // n > before // n

    def _take_snapshot(self, aggregate: Aggregate) -> None:
        # Best effort, after the commit: a missing snapshot only costs a longer replay.
        try:
            self.recorder.save_snapshot(
                Snapshot(aggregate.id, aggregate.version, type(aggregate).__name__, encode_snapshot(aggregate))
            )
        except Exception:
            log.warning("snapshot of %s at version %d not saved", aggregate.id, aggregate.version, exc_info=True)
