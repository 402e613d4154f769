"""The application's ``EventStore`` on PostgreSQL: loading aggregates (snapshot + replay),
appending their events, idempotency records, and taking snapshots of long streams.

No stored event may exceed ``max_event_bytes`` (a Kafka record is made of each one): a
command that would write a larger one is refused with ``EventTooLarge`` before anything
is written.

A stream belongs to the tenant of its first event; a load given a tenant refuses another tenant's
stream (``ForeignStream``), reading the owner in the same single round trip as the events.

It remembers the chain hash of each recently loaded or written stream head, so appending
the next events continues the hash chain without another read in the common case.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TypeVar
from uuid import UUID

import orjson
from eventsourcing.persistence import StoredEvent

from commitline.application.chain import chain
from commitline.application.errors import EventTooLarge, WrongAggregateType
from commitline.application.ports import ForeignStream, IdempotencyRecord
from commitline.domain import Aggregate, Event
from commitline.infrastructure.store.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from commitline.infrastructure.store.recorder import EventRecorder, Snapshot

A = TypeVar("A", bound=Aggregate)
log = logging.getLogger(__name__)


class PostgresEventStore:
    def __init__(self, recorder: EventRecorder, snapshot_interval: int = 100, remembered_heads: int = 100_000, *,
                 max_event_bytes: int = 900_000):
        self.recorder = recorder
        self.snapshot_interval = snapshot_interval
        self.max_event_bytes = max_event_bytes
        self._heads: OrderedDict[UUID, tuple[int, bytes]] = OrderedDict()
        self._heads_limit = remembered_heads
        self._heads_lock = threading.Lock()

    def load(self, cls: type[A], aggregate_id: UUID, *, tenant: str | None = None, use_snapshot: bool = True) -> A:
        """The aggregate as of its latest event (blank if it has none). With ``tenant``, a stream another
        tenant owns raises ForeignStream before anything of it is decoded (not even its type is checked)."""
        snapshot, stored, head_hash = self.recorder.load_stream(
            aggregate_id, after_snapshot=use_snapshot and self.snapshot_interval > 0)
        if tenant is not None:
            owner = stream_owner(snapshot, stored)
            if owner is not None and owner != tenant:
                raise ForeignStream(aggregate_id)
        start: A | None = None
        if snapshot is not None:
            if snapshot.aggregate_type != cls.__name__:
                raise WrongAggregateType(aggregate_id, cls.__name__, snapshot.aggregate_type)
            start = decode_snapshot(cls, snapshot.state)  # type: ignore[assignment]
        recorded = [decode_event(s.topic, s.originator_id, s.originator_version, s.state) for s in stored]
        if recorded and recorded[0].aggregate_type != cls.__name__:
            raise WrongAggregateType(aggregate_id, cls.__name__, recorded[0].aggregate_type)
        aggregate = cls.replay(aggregate_id, [r.event for r in recorded], start)
        self._remember(aggregate_id, aggregate.version, head_hash)
        return aggregate

    def append(
        self, aggregate: Aggregate, events: Sequence[Event], *, tenant: str, idempotency: IdempotencyRecord | None
    ) -> None:
        stored = [encode_event(e, tenant) for e in events]
        for s in stored:
            if len(s.state) > self.max_event_bytes:
                raise EventTooLarge(idempotency.command_type if idempotency else "the command", s.topic, len(s.state),
                                    self.max_event_bytes)
        before = stored[0].originator_version - 1
        links = chain(self._head_hash(aggregate.id, before), stored)
        self.recorder.append(stored, idempotency, links=links)
        self._remember(aggregate.id, aggregate.version, links[-1][1])
        if self._snapshot_due(before, aggregate.version):
            self._take_snapshot(aggregate)

    def find_outcome(self, tenant: str, key: str) -> IdempotencyRecord | None:
        return self.recorder.find_idempotency(tenant, key)

    def stream_version(self, aggregate_id: UUID) -> int:
        return self.recorder.stream_version(aggregate_id)

    def _head_hash(self, aggregate_id: UUID, version: int) -> bytes:
        with self._heads_lock:
            known = self._heads.get(aggregate_id)
        if known is not None and known[0] == version:
            return known[1]
        return self.recorder.event_hash(aggregate_id, version)

    def _remember(self, aggregate_id: UUID, version: int, head_hash: bytes) -> None:
        with self._heads_lock:
            self._heads[aggregate_id] = (version, head_hash)
            self._heads.move_to_end(aggregate_id)
            while len(self._heads) > self._heads_limit:
                self._heads.popitem(last=False)

    def _snapshot_due(self, before: int, after: int) -> bool:
        n = self.snapshot_interval
        return n > 0 and after // n > before // n

    def _take_snapshot(self, aggregate: Aggregate) -> None:
        # Best effort, after the commit: a missing snapshot only costs a longer replay.
        try:
            self.recorder.save_snapshot(Snapshot(
                aggregate.id, aggregate.version, type(aggregate).__name__, encode_snapshot(aggregate),
                self._head_hash(aggregate.id, aggregate.version)))
        except Exception:
            log.warning("snapshot of %s at version %d not saved", aggregate.id, aggregate.version, exc_info=True)


def stream_owner(snapshot: Snapshot | None, stored: Sequence[StoredEvent]) -> str | None:
    """The tenant that owns a stream: the one recorded in its first event (``codec.encode_event`` puts
    ``"tenant"`` in every stored state). None for an empty stream."""
    first = snapshot.first_event_state if snapshot is not None else None
    if first is None and stored:
        first = stored[0].state  # version 1 unless a snapshot precedes it (then ``first`` was read with it)
    return stored_tenant(first) if first is not None else None


def stored_tenant(state: bytes) -> str:
    """The tenant recorded in one stored event's state."""
    return orjson.loads(state)["tenant"]
