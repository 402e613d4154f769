"""One command's way to its one answer (``Dispatch``): the exactly-once rules, each kept by one named step.

1. **Key lookup** (``look_up_and_load``): a (tenant, key) that produced an outcome answers with it before
   any other check; the key's record and the aggregate are one read round trip
   (``EventStore.load_for_command``).
2. **Load** (``look_up_and_load``, ``load_other``): the aggregate the command changes (the store's cached
   copy brought up to date, or its snapshot and the events after it), and any other aggregate it reads, all
   tenant-scoped (rule 8). Zero reads on the hot path: when this process wrote the stream last, the first
   run decides on its cached copy without reading anything (``trust_cache``; the key is then not looked up
   and the copy may be stale: ``verified`` False). Such a run's refusal, lost race or failed append is no
   answer: the command runs again at once on a read (``run``; not a retry, nothing was contended), and only
   that run's answer counts.
3. **Decide** (``decide``): the domain method runs on the loaded copy; it raises on an illegal transition or
   a broken invariant. No transaction is held open meanwhile. A refusal on a verified read is the answer
   unless a twin committed since the lookup (rule 6): the state refused may be the twin's doing.
4. **Append** (``append``): the events and the key's record in one short transaction (the store may share
   it with concurrent commands', each still atomic on its own). The store refuses a used key
   (``KeyAlreadyRecorded``: rule 6), a taken version (``StreamMoved``: rule 5) and an append that does not
   prove its predecessor (``PredecessorMissing``, a ``StreamMoved``: rule 5): version N is stored only on
   version N-1 as stored, with the hash the events chain from, and version 1 only on a stream with no event,
   checked by the store in the append's statement, never by the cache. So neither a used key nor a stale copy
   can be stored, not even a copy of a history that is no longer there (one an asynchronous failover lost).
   A command that decides no events records its key alone (nothing was appended, the answer says the
   stream's version as read); decided on a cached copy, it is first decided again on a read, since no
   append would find the copy stale.
5. **Conflict re-run** (``append``, ``lost_race``, ``run``): a stream moved under a cached copy (or whose
   history under it is gone) is read before every later command (``distrust``) and the command re-runs on a
   read (reported as a retry), deciding on the stored history (``AggregateNotFound`` if the stream is gone).
   Moved under a verified read: with ``expected_version`` a twin's outcome answers (rule 6), else
   ``ConcurrencyConflict`` with the version lost to, read tenant-scoped; without it the command re-runs
   after a jittered back-off, at most ``RetryPolicy.max_attempts`` runs with a read, then
   ``ConcurrencyConflict``.
6. **Twin wait** (``twin_outcome``): a twin with the same key that committed first answers for the key: after
   ``KeyAlreadyRecorded`` (the append waited on the key's unique record for the twin's commit, so its record
   is readable), after a refusal on a verified read, after a lost race with ``expected_version``. Never
   after ``StoreUnavailable``: looking would only wait for the store again.
7. **Replay** (``replay``): the one answer to "what did this key already produce", whichever step found the
   record (the lookup's or a twin's): for the same request (same fingerprint) the answer as first given, as
   ``replayed=True``, which the store reads back from the command's events the record refers to (or, for a
   record from before migration 14, its stored outcome); ``IdempotencyKeyReused`` for any other.
8. **Tenants** (``decide``, ``load_other``, ``lost_race``): a stream belongs to the tenant that created it
   (the tenant of its first event). To any other tenant it does not exist: a command on it, or reading it,
   is refused with ``AggregateNotFound``, with the same error and message as for an id nobody uses, and
   nothing is written. A stream that only exists for another tenant is treated as empty until the command
   has been decided (so every other refusal comes out exactly as for an unused id); a command that would then
   start it is refused instead: ``AggregateNotFound`` for commands that may start a stream or continue it
   (``Stream.ANY``), and for creation commands (``Stream.NEW``) ``InvalidCommand`` on the id field (type
   ``id_unavailable``). One id space is shared by all tenants, so the id being unusable cannot be hidden
   from someone who already knows it; the refusal says no more than that: not that it exists, nor its type,
   owner, version or content (``AggregateAlreadyExists`` stays for the tenant's own streams). An id derived
   from a tenant and an idempotency key (``derived_id``) has a form of its own, and no command may start a
   stream at such an id but its own derived one (``id_unavailable``, whoever holds it, if anyone does): one
   tenant can neither take another's derived id first nor learn, by trying, whether it used a key.

Each rule is asserted, on a real store, by a test named in ``tests/integration/test_dispatching.py`` (the
predecessor of rules 4 and 5 in ``tests/integration/test_predecessor.py``).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Protocol
from uuid import UUID

import orjson
from commitline.application.boundary import problem
from commitline.application.catalog import Handler, Stream
from commitline.application.commands import Command, VersionedCommand
from commitline.application.errors import (
    AggregateAlreadyExists,
    AggregateNotFound,
    CommitlineError,
    ConcurrencyConflict,
    IdempotencyKeyReused,
    InvalidCommand,
    StoreUnavailable,
)
from commitline.application.ports import (
    CommandLoad,
    EventStore,
    ForeignStream,
    IdempotencyRecord,
    KeyAlreadyRecorded,
    StreamMoved,
)
from commitline.application.results import FINGERPRINT_BYTES, DispatchResult, payload_json, result, unstorable, view
from commitline.application.retry import RetryPolicy
from commitline.domain import Aggregate, Event
from commitline.domain.errors import InvalidPersonalValue, InvalidValue
from commitline.domain.personal import personal_names

_DERIVED_ID_PREFIX = b"commitline derived id\x00"
_DERIVED_MARK = b"\xcd\x1d"  # the first two bytes of every derived id (``is_derived``)


class _Unverified(Exception):
    """A run on a cached copy (no read) ended without an answer: decide again on a read."""


class Observer(Protocol):
    """What a dispatch reports while it runs (``DispatchObserver`` in ``processor``): each re-run as a retry."""

    def on_retry(self, command_type: str) -> None: ...


def fingerprint(command: Command) -> bytes:
    """SHA-256 of the request as its sender sent it, in canonical JSON: its type and every field it set, at
    whatever value (a field left out is not in it). Same request, same fingerprint, across releases of the domain
    too: a field the command gains later with a default, or a default that changes, leaves the fingerprint of a
    request sent again byte for byte alone, so a retry after the deploy still replays its first answer.
    ``replay`` also takes a retry that sets a field at its default where the first request left it out."""
    sent = command.model_dump(mode="json", exclude_unset=True)
    sent["type"] = command.type  # a default too (the class's own), and what tells two commands' fields apart
    return _digest(sent)


def defaults_left_out_fingerprint(command: Command) -> bytes:
    """The fingerprint of the request with every field at its default left out, whether sent or not: what records
    written before ``fingerprint`` kept the fields as sent hold, and what a retry that sends a field at its default
    has in common with a first request that left it out. Only ever compared with a stored one ``fingerprint`` does
    not match."""
    sent = command.model_dump(mode="json", exclude_defaults=True)
    sent["type"] = command.type
    return _digest(sent)


def full_fingerprint(command: Command) -> bytes:
    """The fingerprint of records written before fingerprints left defaults out: every field, defaults
    included. Only ever compared with a stored one that ``fingerprint`` does not match."""
    return _digest(command.model_dump(mode="json"))


def _digest(fields: dict[str, Any]) -> bytes:
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).digest()


def _same(stored: bytes, digest: bytes) -> bool:
    return len(stored) >= FINGERPRINT_BYTES and stored == digest[:len(stored)]


def derived_id(tenant: str, key: object) -> UUID:
    """The stream of a command without a target id: derived from its tenant and idempotency key (the SHA-256 of
    both), in a form of its own: a UUID of version 8 whose first four hexadecimal digits are ``cd1d``."""
    raw = bytearray(hashlib.sha256(_DERIVED_ID_PREFIX + f"{tenant}\x00{key}".encode("utf-8", "surrogatepass"))
                    .digest()[:16])
    raw[0:2] = _DERIVED_MARK
    raw[6] = (raw[6] & 0x0F) | 0x80  # version 8
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122's variant
    return UUID(bytes=bytes(raw))


def is_derived(aggregate_id: UUID) -> bool:
    """Whether ``aggregate_id`` has the form of a ``derived_id`` (a random UUID never has: its version is 4)."""
    return aggregate_id.version == 8 and aggregate_id.bytes[:2] == _DERIVED_MARK


def replay(record: IdempotencyRecord, digest: bytes, command: Command) -> DispatchResult:
    """Rule 7: what a key already produced, as the answer to ``command`` (whose fingerprint is ``digest``)."""
    stored = record.fingerprint
    if not (_same(stored, digest) or _same(stored, defaults_left_out_fingerprint(command))
            or _same(stored, full_fingerprint(command))):
        raise IdempotencyKeyReused(record.tenant, record.key, record.command_type, command.type)
    if record.answer is not None:
        return record.answer()
    assert record.outcome is not None, "the store gives a record its answer or its outcome"
    return DispatchResult.from_outcome(record.outcome)


class Dispatch:
    """One validated command on its way to its answer; ``run`` gives it (the steps are the module's rules)."""

    __slots__ = ("store", "observer", "handler", "cmd", "tenant", "key", "digest", "aggregate_id", "expected")

    def __init__(self, store: EventStore, observer: Observer, handler: Handler, cmd: Command, tenant: str,
                 key: str):
        self.store = store
        self.observer = observer
        self.handler = handler
        self.cmd = cmd
        self.tenant = tenant
        self.key = key
        self.digest = fingerprint(cmd)
        self.aggregate_id = handler.target(cmd) or derived_id(tenant, key)
        self.expected = cmd.expected_version if isinstance(cmd, VersionedCommand) else None

    def run(self, retry: RetryPolicy) -> DispatchResult:
        """Rule 5's loop: the first run may decide on the cached copy; one that ends without an answer runs
        again at once on a read (not counted). At most ``max_attempts`` runs on a read, each re-run after
        the stream moved following a jittered pause."""
        trust_cache, n = True, 1
        while True:
            try:
                return self.attempt(trust_cache)
            except _Unverified:
                trust_cache = False
            except StreamMoved:
                if n == retry.max_attempts:  # it moved under every attempt
                    raise ConcurrencyConflict(self.aggregate_id, None, self.store.stream_version(self.aggregate_id),
                                              n) from None
                self.observer.on_retry(self.cmd.type)
                time.sleep(retry.pause(n))
                trust_cache, n = False, n + 1

    def attempt(self, trust_cache: bool) -> DispatchResult:
        """One run: key lookup and load, then replay, or decide and append. Raises ``_Unverified`` when a run
        on an unverified copy has no answer, ``StreamMoved`` when a verified one is to re-run after a pause."""
        loaded = self.look_up_and_load(trust_cache)
        if loaded.earlier is not None:
            return replay(loaded.earlier, self.digest, self.cmd)
        try:
            changed = self.decide(loaded)
        except StoreUnavailable:
            raise  # not a refusal: no twin lookup
        except CommitlineError:
            if not loaded.verified:
                raise _Unverified from None  # refused on a copy that may be stale: read, then decide
            twin = self.twin_outcome()  # a twin may have committed since the lookup, changing what was refused
            if twin is None:
                raise
            return twin
        return self.append(changed, loaded.verified)

    def look_up_and_load(self, trust_cache: bool) -> CommandLoad:
        """Rules 1 and 2: the key's record, or the aggregate to decide on, in one read (or, with ``trust_cache``,
        the store's cached copy and no read at all)."""
        return self.store.load_for_command(self.handler.aggregate, self.aggregate_id, tenant=self.tenant,
                                           key=self.key, trust_cache=trust_cache)

    def decide(self, loaded: CommandLoad) -> Aggregate:
        """Rule 3 (and 8): the aggregate holding the new events, if the stream is as the command needs it (a
        blank stand-in when it is another tenant's, so every check behaves exactly as for an unused id)."""
        handler, aggregate = self.handler, loaded.aggregate
        assert aggregate is not None
        if handler.stream is Stream.NEW and aggregate.exists:
            raise AggregateAlreadyExists(handler.aggregate.__name__, self.aggregate_id)
        if handler.stream is Stream.EXISTING and not aggregate.exists:
            raise AggregateNotFound(handler.aggregate.__name__, self.aggregate_id)
        if self.expected is not None and aggregate.version != self.expected:
            raise ConcurrencyConflict(self.aggregate_id, self.expected, aggregate.version)
        if not aggregate.exists and is_derived(self.aggregate_id) and handler.target(self.cmd) is not None \
                and self.aggregate_id != derived_id(self.tenant, self.key):  # rule 8: whether it is held or not
            raise _id_unavailable(self.cmd, self.aggregate_id, "ids of its form (UUIDv8 beginning cd1d) are kept "
                                  "for those derived from idempotency keys: choose another one, or leave it out "
                                  "to have one derived")
        try:
            changed = handler.run(aggregate, self.cmd, self.load_other)
        except InvalidValue as e:
            if type(e) is InvalidValue and e.field in personal_names(handler.aggregate):
                raise InvalidPersonalValue(e.field, e.reason) from None  # the answer never repeats the value
            raise
        if loaded.foreign:  # decided as if the stream were empty; it is another tenant's: not ours
            raise unavailable(handler, self.cmd, self.aggregate_id)
        return changed

    def load_other(self, cls: type[Aggregate], aggregate_id: UUID) -> Aggregate:
        """Rule 2 (and 8): another aggregate the command reads; it must exist and be the tenant's own."""
        try:
            aggregate = self.store.load(cls, aggregate_id, tenant=self.tenant)
        except ForeignStream:
            raise AggregateNotFound(cls.__name__, aggregate_id) from None
        if not aggregate.exists:
            raise AggregateNotFound(cls.__name__, aggregate_id)
        return aggregate

    def append(self, changed: Aggregate, verified: bool) -> DispatchResult:
        """Rule 4: store the events and the key's record at once, or find out why not (rules 5 and 6)."""
        cmd, tenant = self.cmd, self.tenant
        events = changed.collect_events()
        if not events and not verified:
            # Nothing to append means nothing that would fail on a stale copy: decide again on the stored stream.
            raise _Unverified
        try:
            answer = applied(cmd, tenant, changed, events)
        except orjson.JSONEncodeError:
            if (refusal := unstorable(cmd.type, events)) is None:
                raise
            if not verified:
                raise _Unverified from None  # a used key's outcome still comes first
            raise refusal from None
        # What a replay needs besides the events (read back then): their count, and the type of an aggregate
        # whose command recorded none.
        record = IdempotencyRecord(tenant, self.key, self.digest[:FINGERPRINT_BYTES], cmd.type, self.aggregate_id,
                                   changed.version, None, len(events), None if events else type(changed).__name__)
        try:
            self.store.append(changed, events, tenant=tenant, idempotency=record)
        except KeyAlreadyRecorded:
            twin = self.twin_outcome()
            assert twin is not None, "a committed idempotency record must be readable"
            return twin
        except StreamMoved:
            if not verified:  # another writer moved it under the cached copy: from now on, read before deciding
                self.store.distrust(self.aggregate_id)
                self.observer.on_retry(cmd.type)
                raise _Unverified from None
            if self.expected is None:
                raise  # re-run after a jittered back-off (``run``)
            return self.lost_race()
        except CommitlineError:
            if not verified:
                raise _Unverified from None  # e.g. too large: a used key's outcome still comes first
            raise
        return answer

    def lost_race(self) -> DispatchResult:
        """Rule 5 with ``expected_version``: a twin with this key (a retry racing its own first try) answers;
        else ``ConcurrencyConflict`` with the version lost to, read tenant-scoped so that a stream another
        tenant started meanwhile stays unseen (``AggregateNotFound``)."""
        twin = self.twin_outcome()
        if twin is not None:
            return twin
        assert self.expected is not None
        name = self.handler.aggregate.__name__
        try:
            actual = self.store.load(self.handler.aggregate, self.aggregate_id, tenant=self.tenant).version
        except ForeignStream:
            raise AggregateNotFound(name, self.aggregate_id) from None
        raise ConcurrencyConflict(self.aggregate_id, self.expected, actual) from None

    def twin_outcome(self) -> DispatchResult | None:
        """Rule 6: the outcome a twin with this key committed (replayed by rule 7), None if there is none."""
        record = self.store.find_outcome(self.tenant, self.key)
        return None if record is None else replay(record, self.digest, self.cmd)


def unavailable(handler: Handler, cmd: Command, aggregate_id: UUID) -> CommitlineError:
    """Rule 8: the refusal of a command that would start a stream at an id another tenant's stream has."""
    if handler.stream is not Stream.NEW:
        return AggregateNotFound(handler.aggregate.__name__, aggregate_id)
    return _id_unavailable(cmd, aggregate_id, "choose another one, or leave it out to have one derived from the "
                           "idempotency key")


def _id_unavailable(cmd: Command, aggregate_id: UUID, why: str) -> InvalidCommand:
    loc: list[str | int] = [name for name, value in cmd if value == aggregate_id][:1]
    return InvalidCommand(cmd.type, [problem(loc, f"this id cannot be used: {why}", "id_unavailable")])


def applied(cmd: Command, tenant: str, aggregate: Aggregate, events: list[Event]) -> DispatchResult:
    """The answer of a command whose events are (about to be) stored: built once from valid values, each payload
    as its stored event holds it (``results.payload_json``), which is what a replay reads back."""
    aggregate_type = type(aggregate).__name__
    return result(cmd.type, tenant, aggregate_type, aggregate.id, aggregate.version, tuple(
        view(e.event_id, e.type_name(), aggregate_type, e.aggregate_id, e.version, e.occurred_at, tenant,
             payload_json(e.payload()))
        for e in events))
