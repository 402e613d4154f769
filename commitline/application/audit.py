"""Forensics: an aggregate's history, its state at any version or time, diffs, and verification
of the tamper-evident hash chain. Returns typed objects; the CLI only renders them.

State at a version or time is always rebuilt by replaying events from the first one, never
from a snapshot, so a snapshot can never leak into a historical answer.

Every question about one aggregate is asked as a tenant (default ``"default"``, as for dispatch): an
aggregate of another tenant (the tenant of its first event) is not found, with the same error as an id
nobody uses. ``verify()`` of the whole store is the operator's check and covers every tenant.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, NamedTuple, Protocol
from uuid import UUID

from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from commitline.application.boundary import check_tenant
from commitline.application.chain import GENESIS, stream_prefix
from commitline.application.errors import (AggregateNotFound, AuditQueryError, BeforeCreation, HistoryBroken,
                                          VersionBeyondHead)
from commitline.domain import Aggregate, Event
from commitline.domain.fsm import TransitionTable


class ChainRecord(NamedTuple):
    """One stored event as the verifier sees it (a row of the verifier's read, in this order)."""

    aggregate_id: UUID
    version: int
    topic: str
    state: bytes
    prev_hash: bytes
    event_hash: bytes


@dataclass(frozen=True)
class StoredHistoryEvent:
    event: Event
    aggregate_type: str
    tenant: str


class AuditSource(Protocol):
    def stream(self, aggregate_id: UUID) -> list[StoredHistoryEvent]: ...

    def first_state(self, aggregate_id: UUID) -> bytes | None:
        """The stored state of the stream's first event (None: it has none): it names the owner, read before the
        rest, so another tenant's stream costs no more to refuse than an id nobody uses."""

    def chain_pages(self, aggregate_id: UUID | None) -> Iterator[Sequence[ChainRecord]]:
        """One stream's records, or all of them, ordered by (aggregate id, version), in pages; each record a
        ``ChainRecord`` or a plain tuple of its fields in the same order."""

    def witnessed_versions(self, aggregate_id: UUID | None) -> Mapping[UUID, int]:
        """Per stream, the highest version any command's idempotency record says it reached."""

    def witnessing_tenant(self, aggregate_id: UUID) -> str | None:
        """The tenant of the idempotency records that name the stream (None: no record does)."""

    def event_count(self) -> int: ...


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    recorded_at: datetime
    type: str
    event_id: UUID
    payload: dict[str, Any]
    transition: str | None
    state_after: dict[str, Any]


@dataclass(frozen=True)
class AboutAggregate:
    """What every answer about one aggregate names first."""

    aggregate_id: UUID
    aggregate_type: str


@dataclass(frozen=True)
class AggregateHistory(AboutAggregate):
    tenant: str
    entries: tuple[HistoryEntry, ...]


@dataclass(frozen=True)
class StateAt(AboutAggregate):
    version: int
    recorded_at: datetime
    state: dict[str, Any]


@dataclass(frozen=True)
class StateDiff(AboutAggregate):
    from_version: int
    to_version: int
    changed: dict[str, tuple[Any, Any]]
    events: tuple[HistoryEntry, ...]


@dataclass(frozen=True)
class StreamVerdict:
    aggregate_id: UUID
    events: int
    problem: str | None = None  # "content", "link" or "truncated"
    version: int | None = None  # the first event that does not verify
    detail: str = ""
    tenant: str | None = None  # the stream's owner, as its first event names it (None when it cannot be read)

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class VerificationReport:
    streams: int
    events: int
    seconds: float
    broken: tuple[StreamVerdict, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.broken

    def document(self) -> dict[str, Any]:
        """The report as ``commitline audit verify --json`` prints it and ``GET /v1/audit/verify/{id}`` answers."""
        return {"ok": self.ok, "streams": self.streams, "events": self.events, "seconds": round(self.seconds, 3),
                "broken": [{"aggregate_id": str(v.aggregate_id), "tenant": v.tenant, "problem": v.problem,
                            "version": v.version, "detail": v.detail} for v in self.broken]}


Progress = Callable[[int, int], None]  # (events verified, total)
RecordTenant = Callable[[bytes], str]  # the tenant named in a stored event's state

LARGE_COLLECTION = 50


def _canonical(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        items = [_canonical(v) for v in value]
        try:
            return sorted(items)
        except TypeError:  # members without an order (enum members, mixed types): ordered by how they print
            return sorted(items, key=lambda v: (type(v).__qualname__, repr(v)))
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def state_of(aggregate: Aggregate, *, compact: bool = False) -> dict[str, Any]:
    """The aggregate's fields as JSON-ready values, sets sorted so equal states print equal."""
    # warnings off: a field may hold ERASED (``domain.personal``) in place of its declared type
    state = to_jsonable_python(_canonical(TypeAdapter(type(aggregate)).dump_python(aggregate, warnings=False)))
    if compact:
        state = {k: f"<{len(v)} items>" if isinstance(v, (list, dict)) and len(v) > LARGE_COLLECTION else v
                 for k, v in state.items()}
    return state


def transition(before: Mapping[str, str], after: Mapping[str, str], table: TransitionTable | None = None) -> str | None:
    """The machines' moves an event made, ``machine: BEFORE -> AFTER`` each; one that ``table`` (the current one)
    does not allow says so: a stored history rewritten or reordered, or a table changed since."""
    moves = [f"{machine}: {before.get(machine, '(new)')} -> {state}" + _refused(table, before.get(machine), state)
             for machine, state in after.items() if before.get(machine) != state]
    return "; ".join(moves) or None


def _refused(table: TransitionTable | None, before: str | None, after: str) -> str:
    kind = table.enum if table is not None else None
    if kind is None or before is None:
        return ""
    try:
        allowed = table.can(kind(before), kind(after))  # type: ignore[union-attr]
    except ValueError:  # a state the table's enumeration does not hold
        allowed = False
    return "" if allowed else " (NOT ALLOWED by the current transition table)"


class Auditor:
    def __init__(self, source: AuditSource, aggregate_types: Mapping[str, type[Aggregate]],
                 record_tenant: RecordTenant):
        self.source = source
        self.aggregate_types = aggregate_types
        self.record_tenant = record_tenant

    def _events(self, aggregate_id: UUID, tenant: str) -> tuple[type[Aggregate], list[StoredHistoryEvent]]:
        check_tenant(tenant)
        first = self.source.first_state(aggregate_id)
        if first is None or self._tenant_of_state(first) != tenant:
            raise AggregateNotFound("aggregate", aggregate_id)
        try:
            stored = self.source.stream(aggregate_id)
        except ValueError as e:  # an event that does not decode (a sealed field changed in place, say)
            raise HistoryBroken(aggregate_id, f"an event does not decode: {e}") from None
        if not stored or stored[0].tenant != tenant:
            raise AggregateNotFound("aggregate", aggregate_id)
        versions = [s.event.version for s in stored]
        if versions != list(range(1, len(stored) + 1)):  # replayed, it would fail at the first one out of place
            expected = next(v for v, found in enumerate(versions, start=1) if found != v)
            raise HistoryBroken(aggregate_id, f"version {expected} is not where it belongs (stored versions: "
                                f"{', '.join(map(str, versions[:20]))}{', ...' if len(versions) > 20 else ''})")
        return self.aggregate_types[stored[0].aggregate_type], stored

    def history(self, aggregate_id: UUID, *, compact: bool = True, tenant: str = "default") -> AggregateHistory:
        cls, stored = self._events(aggregate_id, tenant)
        return AggregateHistory(aggregate_id, cls.__name__, stored[0].tenant,
                                tuple(self._entries(cls, aggregate_id, stored, compact)))

    def _entries(self, cls: type[Aggregate], aggregate_id: UUID, stored: Sequence[StoredHistoryEvent],
                 compact: bool, start: Aggregate | None = None) -> Iterator[HistoryEntry]:
        aggregate = start or cls.blank(aggregate_id)
        for s in stored:
            before = aggregate.fsm_states()
            aggregate.apply(s.event)
            yield HistoryEntry(s.event.version, s.event.occurred_at, s.event.type_name(), s.event.event_id,
                               TypeAdapter(dict).dump_python(s.event.payload(), mode="json"),
                               transition(before, aggregate.fsm_states(), cls.TRANSITIONS),
                               state_of(aggregate, compact=compact))

    def current(self, aggregate_id: UUID, *, tenant: str = "default") -> StateAt:
        """The state at the aggregate's last version (replayed, like every other answer here)."""
        cls, stored = self._events(aggregate_id, tenant)
        return self._state(cls, aggregate_id, stored)

    def state_at_version(self, aggregate_id: UUID, version: int | None, *, tenant: str = "default") -> StateAt:
        """The state replayed up to ``version`` (None: the last one)."""
        if version is not None and version < 1:
            raise AuditQueryError(f"there is no version {version}: versions start at 1", version=version)
        cls, stored = self._events(aggregate_id, tenant)
        if version is None:
            version = len(stored)
        if version > len(stored):
            raise VersionBeyondHead(f"{aggregate_id} has versions 1 to {len(stored)}; there is no version {version}",
                                    aggregate_id=aggregate_id, version=version, head=len(stored))
        return self._state(cls, aggregate_id, stored[:version])

    def state_as_of(self, aggregate_id: UUID, moment: datetime, *, tenant: str = "default") -> StateAt:
        if moment.tzinfo is None:
            raise AuditQueryError("the time must carry a UTC offset, e.g. 2026-11-21T05:42:00+00:00", time=moment)
        cls, stored = self._events(aggregate_id, tenant)
        # The events up to the first one after the moment, in version order: each event's time is its deciding
        # process's clock, so two processes' clocks apart may record a version earlier than the one before it.
        prefix = list(itertools.takewhile(lambda s: s.event.occurred_at <= moment, stored))
        if not prefix:
            raise BeforeCreation(f"{aggregate_id} did not exist yet at {moment.isoformat()}; "
                                 f"it was created at {stored[0].event.occurred_at.isoformat()}",
                                 aggregate_id=aggregate_id, time=moment.isoformat())
        return self._state(cls, aggregate_id, prefix)

    def _state(self, cls: type[Aggregate], aggregate_id: UUID, stored: Sequence[StoredHistoryEvent]) -> StateAt:
        aggregate = cls.replay(aggregate_id, [s.event for s in stored])
        return StateAt(aggregate_id, cls.__name__, aggregate.version, stored[-1].event.occurred_at, state_of(aggregate))

    def diff(self, aggregate_id: UUID, from_version: int, to_version: int, *, tenant: str = "default") -> StateDiff:
        if from_version < 0:
            raise AuditQueryError(f"--from {from_version}: versions start at 1 (--from 0 is before the first event)",
                                  version=from_version)
        if from_version > to_version:
            raise AuditQueryError(f"--from {from_version} is after --to {to_version}")
        cls, stored = self._events(aggregate_id, tenant)
        if to_version > len(stored):
            raise VersionBeyondHead(f"{aggregate_id} has versions 1 to {len(stored)}; there is no version {to_version}",
                                    aggregate_id=aggregate_id, version=to_version, head=len(stored))
        before = cls.replay(aggregate_id, [s.event for s in stored[:from_version]])
        old = state_of(before)
        entries = tuple(self._entries(cls, aggregate_id, stored[from_version:to_version], True, start=before))
        new = state_of(before)  # ``before`` was advanced in place to ``to_version``
        changed = {k: (old.get(k), new.get(k)) for k in new if old.get(k) != new.get(k)}
        return StateDiff(aggregate_id, cls.__name__, from_version, to_version, changed, entries)

    def verify(self, aggregate_id: UUID | None = None, progress: Progress | None = None, *,
               tenant: str = "default") -> VerificationReport:
        """Verify one aggregate of ``tenant``, or (``aggregate_id`` None) every stream of every tenant."""
        started = time.perf_counter()
        # the total is only shown with the progress (counting the store costs a scan of it)
        total = self.source.event_count() if aggregate_id is None and progress is not None else 0
        if aggregate_id is not None:
            check_tenant(tenant)
            # the owner before the stream (no more work for another tenant's id than for an unknown one); no event
            # left: the idempotency records still name the owner
            first = self.source.first_state(aggregate_id)
            owner = (self._tenant_of_state(first) if first is not None
                     else self.source.witnessing_tenant(aggregate_id))
            if owner != tenant:
                raise AggregateNotFound("aggregate", aggregate_id)
        pages: Iterable[Sequence[ChainRecord]] = self.source.chain_pages(aggregate_id)
        witnesses = self.source.witnessed_versions(aggregate_id)
        streams, events, broken, witnessed_seen = check_chains(pages, witnesses, progress, total)
        if witnessed_seen < sum(1 for version in witnesses.values() if version > 0):  # some have no event left
            vanished = vanished_streams(self.source.chain_pages(aggregate_id), witnesses)
            streams += len(vanished)
            broken += vanished
        if aggregate_id is not None and streams == 0:
            raise AggregateNotFound("aggregate", aggregate_id)
        owned = [replace(v, tenant=self._tenant_of_stream(v.aggregate_id)) for v in broken]
        return VerificationReport(streams, events, time.perf_counter() - started, tuple(owned))

    def _tenant_of_stream(self, aggregate_id: UUID) -> str | None:
        """The owner of a broken stream, for the operator's next command (``audit verify --aggregate ID -t T``)."""
        first = next((r for page in self.source.chain_pages(aggregate_id) for r in page), None)
        if first is None:  # no event left: the idempotency records still name the owner
            return self.source.witnessing_tenant(aggregate_id)
        return self._tenant_of(ChainRecord(*first))

    def _tenant_of(self, first: ChainRecord) -> str | None:
        return self._tenant_of_state(first.state)

    def _tenant_of_state(self, state: bytes) -> str | None:
        # The first stored event names the owner; one too damaged to read proves no ownership.
        try:
            return self.record_tenant(state)
        except (ValueError, KeyError, TypeError):
            return None


_VERSIONS_CACHED = 1024
_VERSION_TEXT = [str(v).encode() for v in range(_VERSIONS_CACHED)]  # a version as the content spells it


def check_chains(pages: Iterable[Sequence[ChainRecord]], witnesses: Mapping[UUID, int],
                 progress: Progress | None = None, total: int = 0) -> tuple[int, int, list[StreamVerdict], int]:
    """Re-derive every stream's chain from ``pages`` of records (ordered by aggregate id, version): (streams,
    events, the verdicts of the streams that do not verify, how many of the streams ``witnesses`` names were
    read: fewer than it names means some have no event left, ``vanished_streams``). ``progress`` is told after
    each page.

    Per record: ``hash = SHA-256(prev_hash || content)`` must equal its stored hash ("content" otherwise),
    its version must follow the one before it and its ``prev_hash`` must be that event's hash ("link"); a
    stream whose last version is below the one an idempotency record witnessed was cut short ("truncated").
    This is ``chain.link(prev, chain.content(...))`` with the stream's part of the content built once per
    stream (the records of a stream are consecutive)."""
    sha256 = hashlib.sha256
    topics: dict[str, bytes] = {}
    broken: list[StreamVerdict] = []
    streams = events = 0
    current: UUID | None = None
    current_int = -1
    prefix = b""
    count = last_version = 0
    expected_prev, expected_version = GENESIS, 1
    versions = _VERSION_TEXT
    verdict: StreamVerdict | None = None
    witnessed_seen = 0

    def finish() -> None:
        nonlocal witnessed_seen
        assert current is not None
        witnessed = witnesses.get(current, 0)
        witnessed_seen += witnessed > 0
        if verdict is not None:
            broken.append(StreamVerdict(current, count, verdict.problem, verdict.version, verdict.detail))
            return
        if witnessed > last_version:
            broken.append(StreamVerdict(
                current, count, "truncated", last_version + 1,
                f"the stream ends at version {last_version}, but an idempotency record says a command took it to "
                f"version {witnessed}: events were removed from its end"))

    for page in pages:
        for aggregate_id, version, topic, state, prev_hash, event_hash in page:
            if aggregate_id.int != current_int:
                if current is not None:
                    finish()
                    streams += 1
                    events += count
                current, current_int, count, last_version, verdict = aggregate_id, aggregate_id.int, 0, 0, None
                prefix = stream_prefix(aggregate_id)
                expected_prev, expected_version = GENESIS, 1
            count += 1
            if verdict is not None:
                last_version = version
                continue
            encoded = topics.get(topic)
            if encoded is None:
                encoded = topics[topic] = b"\x00" + topic.encode() + b"\x00"
            text = versions[version] if 0 < version < _VERSIONS_CACHED else str(version).encode()
            if sha256(b"".join((prev_hash, prefix, text, encoded, state))).digest() != event_hash:
                verdict = StreamVerdict(aggregate_id, 0, "content", version,
                                        f"version {version} ({topic}) no longer matches its recorded hash: "
                                        "its content was changed")
            elif version != expected_version:
                verdict = StreamVerdict(aggregate_id, 0, "link", version,
                                        f"version {expected_version} is missing before version {version}")
            elif prev_hash != expected_prev:
                verdict = StreamVerdict(aggregate_id, 0, "link", version,
                                        f"version {version} does not link to the event before it: "
                                        "an event was inserted, removed or reordered")
            expected_prev, expected_version = event_hash, version + 1
            last_version = version
        if progress is not None:
            progress(events + count, total)
    if current is not None:
        finish()
        streams += 1
        events += count
    return streams, events, broken, witnessed_seen


def vanished_streams(pages: Iterable[Sequence[ChainRecord]], witnesses: Mapping[UUID, int]) -> list[StreamVerdict]:
    """The streams an idempotency record says a command took past version 0 of which ``pages`` (ordered by
    aggregate id) hold no event: every event of theirs was removed ("truncated" at version 1). A merge of the
    witnessed ids, sorted, with the ids read, so that no set of every stream is held."""
    pending = sorted((a for a, version in witnesses.items() if version > 0), key=lambda a: a.int)
    at, gone = 0, []
    for page in pages:
        for record in page:
            read = record[0].int
            while at < len(pending) and pending[at].int < read:
                gone.append(pending[at])
                at += 1
            if at < len(pending) and pending[at].int == read:
                at += 1
    gone += pending[at:]
    return [StreamVerdict(a, 0, "truncated", 1,
                          f"no event of the stream is left, but an idempotency record says a command took it to "
                          f"version {witnesses[a]}: its events were removed") for a in gone]
