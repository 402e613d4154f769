"""The application's ``EventStore`` on PostgreSQL: loading aggregates (snapshot + replay),
appending their events, idempotency records, and taking snapshots of long streams (written behind the
commands, ``snapshot_writer.py``).

No stored event may exceed ``max_event_bytes`` (a Kafka record is made of each one): a
command that would write a larger one is refused with ``EventTooLarge`` before anything
is written.

A stream belongs to the tenant of its first event; a load given a tenant refuses another tenant's
stream (``ForeignStream``), reading the owner in the same single round trip as the events.

It remembers the chain hash of each recently loaded or written stream head, so appending
the next events continues the hash chain without another read in the common case.

The command path (``load_for_command`` then ``append``): at most one read round trip (the idempotency
key's record and the stream's new events in one statement, sent with concurrent commands' reads:
``group_read``), none when the processor may decide on the cached copy (``trust_cache``); the decoded aggregate
kept between commands (``aggregate_cache``), and appends coalesced with those of concurrent commands
(``group_commit``).

An idempotency record refers to its command's events instead of holding a copy of its answer; a replay reads
them back (``replays.py``). Personal fields (``domain.personal``) are sealed by the codec before the chain hashes
the stored bytes (a replay opens them, as the first answer showed them), a record from before migration 14 holds
its outcome with them sealed (``personal/outcomes.py``), and so do the snapshots of an
aggregate type whose events have personal fields (``personal/snapshots.py``): a snapshot whose subject was erased
is passed over, and the stream replayed from its first event. A new subject's data key is inserted by the
append of the command that first seals under it, in its transaction (``personal/cipher.NewKeys``); if the
subject got a key meanwhile, the append is refused and the events sealed again under that key (once: a second
refusal re-runs the command, as a moved stream does).
"""

from __future__ import annotations

import logging
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar
from uuid import UUID

import orjson
from eventsourcing.persistence import StoredEvent

from commitline.application.chain import GENESIS, chain
from commitline.application.errors import EventTooLarge, HistoryBroken, WrongAggregateType
from commitline.application.ports import CommandLoad, ForeignStream, IdempotencyRecord
from commitline.application.results import DispatchResult, unstorable
from commitline.domain import Aggregate, Event
from commitline.domain.personal import personal_fields
from commitline.infrastructure.personal import outcomes, snapshots
from commitline.infrastructure.personal.cipher import NewKeys
from commitline.infrastructure.store.aggregate_cache import AggregateCache, Entry
from commitline.infrastructure.store.codec import EventCodec, decode_snapshot, encode_snapshot
from commitline.infrastructure.store.event_versions import EventVersions
from commitline.infrastructure.store.group_commit import GroupCommitter
from commitline.infrastructure.store.group_read import GroupReader
from commitline.infrastructure.store import replays
from commitline.infrastructure.store.recorder import EventRecorder, PendingAppend, SubjectKeyTaken
from commitline.infrastructure.store.snapshot_shape import parsed_type, shape_of, stored_type
from commitline.infrastructure.store.snapshot_writer import SnapshotWriter
from commitline.infrastructure.store.streams import CommandRead, ReadArgs, ReadEvent, Snapshot

A = TypeVar("A", bound=Aggregate)
log = logging.getLogger(__name__)


class PostgresEventStore:
    def __init__(self, recorder: EventRecorder, codec: EventCodec, snapshot_interval: int = 10,
                 remembered_heads: int = 100_000, *, max_event_bytes: int = 900_000, cache_size: int = 10_000,
                 group_commit: int = 48, versions: EventVersions | None = None, tracing: Any = None):
        """``codec``: the domain's event classes; ``cache_size``: aggregates kept decoded (0: none);
        ``group_commit``: the most commands per shared transaction (0: every append in its own, as
        ``recorder.append`` does it); ``versions``: where each new (event type, class version) is recorded
        before its first event is stored; ``tracing``: ``infrastructure/tracing.Tracing`` (None: off)."""
        self.recorder = recorder
        self.tracing = tracing
        self.codec = codec
        self.versions = versions
        self.cache = AggregateCache(cache_size)
        self.committer = GroupCommitter(recorder, max_batch=group_commit, tracing=tracing) if group_commit else None
        #: the reads before commands, coalesced like their appends (``group_read``) unless group commit is off
        self.reader = GroupReader(recorder) if group_commit else None
        self.snapshot_interval = snapshot_interval
        self.snapshots = SnapshotWriter(recorder.save_snapshots)
        #: each aggregate type's snapshot shape (``snapshot_shape.py``), worked out now, from the files just imported
        self._shapes: dict[type[Aggregate], str] = {a: shape_of(a) for a in codec.registry.aggregates}
        #: aggregate types a snapshot of which could not be decoded by this code: none is taken any more
        self._unsnapshottable: set[type[Aggregate]] = set()
        self.max_event_bytes = max_event_bytes
        self._heads: OrderedDict[UUID, tuple[int, bytes]] = OrderedDict()
        self._heads_limit = remembered_heads
        self._heads_lock = threading.Lock()
        #: the cache epoch each aggregate lent to a command was decoded in (see ``forget``)
        self._decoded_in: OrderedDict[UUID, int] = OrderedDict()
        #: each aggregate type whose events have personal fields, with the names of their subjects
        self._personal_aggregates = {a: subjects for a in codec.registry.aggregates
                                     if (subjects := tuple(dict.fromkeys(s for e in a.EVENTS
                                                                         for _, s in personal_fields(e))))}
        if self._personal_aggregates and codec.personal is None:
            raise ValueError("the domain declares personal fields: the event store's codec needs keys to seal them")

    def load(self, cls: type[A], aggregate_id: UUID, *, tenant: str | None = None, use_snapshot: bool = True) -> A:
        """The aggregate as of its latest event (blank if it has none). With ``tenant``, a stream another
        tenant owns raises ForeignStream before anything of it is decoded (not even its type is checked)."""
        snapshot, stored, head_hash = self.recorder.load_stream(
            aggregate_id, after_snapshot=use_snapshot and self.snapshot_interval > 0)
        owner = stream_owner(snapshot, stored) if tenant is not None or snapshot is not None else None
        if tenant is not None and owner is not None and owner != tenant:
            raise ForeignStream(aggregate_id)
        start: A | None = None
        if snapshot is not None:
            start = self._snapshot_start(cls, snapshot, owner)
            if start is None:  # not to be used: from the first event
                _, stored, head_hash = self.recorder.load_stream(aggregate_id, after_snapshot=False)
        aggregate = self._replayed(cls, aggregate_id, [(s.originator_version, s.topic, orjson.loads(s.state))
                                                       for s in stored], start)
        self._remember(aggregate_id, aggregate.version, head_hash)
        if snapshot is not None and start is None:
            self._snapshot_again(aggregate, owner, head_hash)
        return aggregate

    def load_for_command(self, cls: type[A], aggregate_id: UUID, *, tenant: str, key: str,
                         trust_cache: bool = False) -> CommandLoad:
        """The idempotency key's record if it has one (then nothing else is decoded), else the aggregate
        to decide on (the cached one brought up to date, or loaded), in one read round trip.

        With ``trust_cache``, a cached copy of a stream no other writer was seen to move is returned as it
        is, without any read (``verified=False``)."""
        epoch = self.cache.epoch  # before the aggregate leaves the cache, or is decoded
        entry = self.cache.take(aggregate_id)
        if entry is not None and type(entry.aggregate) is not cls:
            entry = None  # a load of the wrong type raises below, as ``load`` does
        if entry is not None and entry.owner != tenant:  # a stream's owner never changes: no read needed
            self.cache.put(entry, epoch)
            return CommandLoad(cls.blank(aggregate_id), True, None)
        self._lent(aggregate_id, epoch)
        if entry is not None and trust_cache and self.cache.trusted(aggregate_id):
            return CommandLoad(entry.aggregate, False, None, verified=False)
        known = entry.aggregate.version if entry is not None else 0
        read = self._read(ReadArgs(aggregate_id, known, entry is None and self.snapshot_interval > 0, tenant, key))
        if read.idempotency is not None:
            if entry is not None:
                self.cache.put(entry, epoch)
            return CommandLoad(None, False, self._revealed(read.idempotency))
        if entry is not None and read.events and (read.events[0].version != known + 1
                                                  or read.events[-1].version != known + len(read.events)):
            entry = None  # cannot happen with an append-only store: trust nothing, read it all again
            read = self._read(ReadArgs(aggregate_id, 0, self.snapshot_interval > 0, tenant, key))
        if entry is not None:
            aggregate: A = entry.aggregate  # type: ignore[assignment]
            decode = self.codec.decode_state
            for e in read.events:
                aggregate.apply(decode(e.topic, aggregate_id, e.version, orjson.loads(e.state)))
        else:
            try:
                aggregate = self._decoded(cls, aggregate_id, read, tenant)
            except ForeignStream:
                return CommandLoad(cls.blank(aggregate_id), True, None)
        if read.head_hash is not None or entry is None:  # else the append that cached it remembered its head
            self._remember(aggregate_id, aggregate.version, read.head_hash or GENESIS)
        return CommandLoad(aggregate, False, None)

    def _read(self, args: ReadArgs) -> CommandRead:
        return self.reader.read(args) if self.reader is not None else self.recorder.read_for_command(*args)

    def _lent(self, aggregate_id: UUID, epoch: int) -> None:
        with self._heads_lock:  # with two commands of one stream at once, the older epoch counts
            self._decoded_in[aggregate_id] = min(epoch, self._decoded_in.get(aggregate_id, epoch))
            self._decoded_in.move_to_end(aggregate_id)
            while len(self._decoded_in) > self._heads_limit:
                self._decoded_in.popitem(last=False)

    def _decoded(self, cls: type[A], aggregate_id: UUID, read: CommandRead, tenant: str) -> A:
        """The aggregate from a command's read: its snapshot (if any) and the events after it, each state parsed
        once (the first one's names the owner, when no snapshot came with the state of the stream's first)."""
        events = read.events
        head = orjson.loads(events[0].state) if events else None
        first = read.snapshot.first_event_state if read.snapshot is not None else None
        owner = stored_tenant(first) if first is not None else head["tenant"] if head is not None else None
        if owner is not None and owner != tenant:
            raise ForeignStream(aggregate_id)  # before any more of it is parsed
        states = [head, *(orjson.loads(e.state) for e in events[1:])] if head is not None else []
        start: A | None = None
        head_hash: bytes | None = None
        if read.snapshot is not None:
            start = self._snapshot_start(cls, read.snapshot, owner)
            if start is None:  # not to be used: from the first event
                _, stored, head_hash = self.recorder.load_stream(aggregate_id, after_snapshot=False)
                events = [ReadEvent(s.originator_version, s.topic, s.state) for s in stored]
                states = [orjson.loads(e.state) for e in events]
        aggregate = self._replayed(cls, aggregate_id, [(e.version, e.topic, state) for e, state in zip(events, states)],
                                   start)
        if head_hash is not None:
            self._snapshot_again(aggregate, owner, head_hash)
        return aggregate

    def _replayed(self, cls: type[A], aggregate_id: UUID, stored: list[tuple[int, str, dict[str, Any]]],
                  start: A | None) -> A:
        """``start`` (None: blank) with the stored events applied: (version, type name, parsed state) each."""
        first = (start.version if start is not None else 0) + 1
        if stored and (stored[0][0] != first or stored[-1][0] != first + len(stored) - 1):
            raise HistoryBroken(aggregate_id, f"version {_out_of_place(stored, first)} is not where it belongs "
                                f"(stored versions after {first - 1}: {', '.join(str(v) for v, *_ in stored[:20])}"
                                f"{', ...' if len(stored) > 20 else ''})")
        decode = self.codec.decode_state
        events = [decode(topic, aggregate_id, version, state) for version, topic, state in stored]
        if events and (found := self.codec.registry.aggregate_of_event[type(events[0])].__name__) != cls.__name__:
            raise WrongAggregateType(aggregate_id, cls.__name__, found)
        return cls.replay(aggregate_id, events, start)

    def _snapshot_start(self, cls: type[A], snapshot: Snapshot, owner: str | None) -> A | None:
        """The state ``snapshot`` holds, to replay the events after it on; None when it is not to be used: taken
        by other code (another shape, ``snapshot_shape.py``), its subject erased, or not decodable by this code."""
        name, shape = parsed_type(snapshot.aggregate_type)
        if name != cls.__name__:
            raise WrongAggregateType(snapshot.aggregate_id, cls.__name__, name)
        if shape != self._shape(cls):
            return None
        sealed = cls in self._personal_aggregates
        state = snapshots.open_state(self.codec.personal, owner or "", snapshot.aggregate_id, snapshot.version,
                                     snapshot.state, sealed=sealed)
        if state is None:
            if sealed and not snapshot.state.startswith(snapshots.MARK):
                log.error("the snapshot of %s %s at version %d is not sealed, as every snapshot of %s is: not used "
                          "(replayed from the first event); run `commitline audit verify --aggregate %s --tenant %s`",
                          cls.__name__, snapshot.aggregate_id, snapshot.version, cls.__name__, snapshot.aggregate_id,
                          owner or "default")
            return None
        try:
            return decode_snapshot(cls, state)  # type: ignore[return-value]
        except Exception:
            if cls not in self._unsnapshottable:
                self._unsnapshottable.add(cls)
                log.warning("a snapshot of %s %s cannot be decoded by the class that took it (a field whose type "
                            "does not survive JSON?): its streams are replayed from their first event, and this "
                            "process takes no more snapshots of %s", cls.__name__, snapshot.aggregate_id,
                            cls.__name__, exc_info=True)
            return None

    def _shape(self, cls: type[Aggregate]) -> str:
        shape = self._shapes.get(cls)
        if shape is None:
            shape = self._shapes[cls] = shape_of(cls)
        return shape

    def _snapshot_again(self, aggregate: Aggregate, owner: str | None, head_hash: bytes) -> None:
        """After a replay from the first event past a snapshot that was not used: a snapshot of this code, so
        that the next load starts from it."""
        if self.snapshot_interval > 0 and aggregate.version >= self.snapshot_interval:
            self._take_snapshot(aggregate, owner, head_hash)

    def append(
        self, aggregate: Aggregate, events: Sequence[Event], *, tenant: str, idempotency: IdempotencyRecord | None
    ) -> None:
        """Store the events and the key's record atomically (coalesced with concurrent commands' appends
        when group commit is on); then ``aggregate``, now the stream's head, is kept in the cache."""
        if self.tracing is None:
            self._append(aggregate, events, tenant, idempotency, None)
            return
        with self.tracing.append(len(events)) as trace:
            self._append(aggregate, events, tenant, idempotency, trace)

    def _append(self, aggregate: Aggregate, events: Sequence[Event], tenant: str,
                idempotency: IdempotencyRecord | None, trace: Any) -> None:
        with self._heads_lock:
            epoch = self._decoded_in.pop(aggregate.id, self.cache.epoch)
        if not events:  # the command changed nothing: only its key is recorded (the cached copy stays as it is)
            if idempotency is not None:
                self.recorder.record_key(idempotency)
            return
        personal = self.codec.personal if type(aggregate) in self._personal_aggregates else None
        new_keys = NewKeys() if personal is not None else None
        while True:
            try:
                links = self._store(aggregate, events, tenant, idempotency, trace, new_keys)
                break
            except SubjectKeyTaken:
                if new_keys is None or not new_keys.guess:
                    raise  # taken again, on the keys read just before: the command runs again (a moved stream)
                new_keys = NewKeys(guess=False)  # sealed again, under the keys the subjects have, read
        if personal is not None and new_keys is not None:
            personal.stored(new_keys)
        self._remember(aggregate.id, aggregate.version, links[-1][1])
        if self._snapshot_due(events[0].version - 1, aggregate.version):
            self._take_snapshot(aggregate, tenant, links[-1][1])
        self.cache.put(Entry(aggregate, tenant), epoch)

    def _store(self, aggregate: Aggregate, events: Sequence[Event], tenant: str,
               idempotency: IdempotencyRecord | None, trace: Any,
               new_keys: NewKeys | None) -> list[tuple[bytes, bytes]]:
        """Seal and encode the events (a new subject's key into ``new_keys``) and append them with the key's
        record and those keys, in one transaction; their chain links."""
        traceparent = trace.traceparent if trace is not None else None
        try:
            stored = [self.codec.encode(e, tenant, traceparent, aggregate, new_keys) for e in events]
        except orjson.JSONEncodeError:  # dispatch refuses these before (building the answer), other callers here
            refusal = unstorable(idempotency.command_type if idempotency else "the command", events)
            if refusal is None:
                raise
            raise refusal from None
        if idempotency is not None and idempotency.outcome is not None and new_keys is not None:
            idempotency = dataclasses.replace(idempotency, outcome=outcomes.protect(idempotency.outcome, stored))
        for s in stored:
            if len(s.state) > self.max_event_bytes:
                raise EventTooLarge(idempotency.command_type if idempotency else "the command", s.topic, len(s.state),
                                    self.max_event_bytes)
        if self.versions is not None:
            self.versions.ensure((e.type_name(), e.class_version) for e in events)
        keys = new_keys.rows if new_keys is not None else []
        links = chain(self._head_hash(aggregate.id, stored[0].originator_version - 1), stored)
        if self.committer is not None:
            outcome = self.committer.append_many([PendingAppend(stored, idempotency, links, trace, keys)])[0]
            if isinstance(outcome, BaseException):
                raise outcome
        else:
            self.recorder.append(stored, idempotency, links=links, keys=keys)
        return links

    def distrust(self, aggregate_id: UUID) -> None:
        self.cache.distrust(aggregate_id)

    def find_outcome(self, tenant: str, key: str) -> IdempotencyRecord | None:
        found = self.recorder.find_idempotency(tenant, key)
        return self._revealed(*found) if found is not None else None

    def _revealed(self, record: IdempotencyRecord,
                  events: list[tuple[int, str, bytes]] | None = None) -> IdempotencyRecord:
        """A record found, with its answer: read back from the events it refers to (``replays``: ``events`` when
        they were read with it, else read when the answer is asked for), or, for a record from before migration 14,
        its stored outcome with its personal fields opened."""
        if record.outcome is None:
            def answer() -> DispatchResult:
                rows = events
                if rows is None:
                    rows = self.recorder.command_events(record.aggregate_id, replays.first_version(record),
                                                        record.stream_version) if record.event_count else []
                return replays.answer(record, rows, self.codec)
            return dataclasses.replace(record, answer=answer)
        outcome = outcomes.reveal(record.outcome, self.codec.personal)
        return record if outcome is record.outcome else dataclasses.replace(record, outcome=outcome)

    def forget(self, key_ids: Iterable[UUID]) -> None:
        """After an erasure (this process's, or another's: ``personal/erasure_watch.py``): the erased data keys
        are never used again here, and no aggregate stays decoded, nor is put back by a command that decoded
        it before."""
        if self.codec.personal is not None:
            self.codec.personal.forget(key_ids)
        self.cache.clear()

    def forget_all(self) -> None:
        """When erasures may have been missed: every data key held and every decoded aggregate is dropped."""
        if self.codec.personal is not None:
            self.codec.personal.forget_all()
        self.cache.clear()

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

    def _take_snapshot(self, aggregate: Aggregate, tenant: str | None = None, head_hash: bytes | None = None) -> None:
        """Offer the aggregate's state, encoded now (the aggregate goes on changing), to the snapshot writer.
        ``tenant``: the stream's owner, whose subject's key seals the snapshot of an aggregate with personal
        fields (without it, such an aggregate is not snapshotted); ``head_hash``: the chain hash of the event
        at the aggregate's version (None: looked up)."""
        # Best effort, after the commit: a missing snapshot only costs a longer replay.
        if type(aggregate) in self._unsnapshottable:
            return
        try:
            subjects = self._personal_aggregates.get(type(aggregate))
            if subjects is not None and (tenant is None or self.codec.personal is None
                                         or not snapshots.sealable(aggregate, subjects)):
                return
            state: bytes | None = encode_snapshot(aggregate)
            if subjects is not None:
                state = snapshots.seal(self.codec.personal, tenant, aggregate, subjects, state)  # type: ignore[arg-type]
            if state is None:
                return
            self.snapshots.offer(Snapshot(
                aggregate.id, aggregate.version, stored_type(type(aggregate).__name__, self._shape(type(aggregate))),
                state,
                head_hash if head_hash is not None else self._head_hash(aggregate.id, aggregate.version)))
        except Exception:
            log.warning("snapshot of %s at version %d not taken", aggregate.id, aggregate.version, exc_info=True)

    def flush_snapshots(self, timeout: float | None = None) -> bool:
        """Wait until the snapshots taken so far are written (or given up); False if ``timeout`` passed first."""
        return self.snapshots.flush(timeout)

    def close(self) -> None:
        """Write the snapshots still queued; before the store's connections close."""
        self.snapshots.close()


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


def _out_of_place(stored: Sequence[tuple[int, str, Any]], first: int) -> int:
    """The first version missing or out of place among ``stored`` (read in version order from ``first``)."""
    return next((v for v, (found, *_) in enumerate(stored, start=first) if found != v), first + len(stored))

