"""``CommandProcessor.dispatch``: validate, deduplicate, load, decide, append, exactly once.

1. Validate the command (the boundary, then pydantic), the key and the tenant; a bad one raises
   before any I/O.
2. Look the (tenant, key) up: a stored outcome with the same fingerprint is returned
   as ``replayed=True``; a different fingerprint raises IdempotencyKeyReused.
3. Load the aggregate (the store's cached copy brought up to date, or its snapshot and the events
   after it), and any other aggregate the command reads, all tenant-scoped (below). Steps 2 and 3
   are one read round trip (``EventStore.load_for_command``).
   Zero reads on the hot path: when this process wrote the stream last, its cached copy is decided on
   without reading anything. The append still checks the key (its record is unique) and the version
   (the stream's next one is unique), so a used key or a stale copy cannot be stored; if the append or
   the decision refuses, the command runs again on steps 2 and 3 with a read, and only that run's answer
   counts. A stream found moved under its cached copy is read before every later command.
4. Run the domain method; it raises on an illegal transition or a broken invariant
   (unless a twin with the same key committed meanwhile: then the twin's outcome is returned).
5. Append the events and the idempotency record in one short transaction (which the store may share
   with concurrent commands', each still atomic on its own). If the
   stream moved meanwhile: with ``expected_version`` raise ConcurrencyConflict, without
   it reload and decide again after a jittered back-off, a bounded number of times.
   If a concurrent twin with the same key committed first, return its outcome.
No transaction is held open while the domain decides.

Tenants: a stream belongs to the tenant that created it (the tenant of its first event). To any other
tenant it does not exist: a command on it, or reading it, is refused with ``AggregateNotFound``, with
the same error and message as for an id nobody uses, and nothing is written. A stream that only exists
for another tenant is treated as empty until the command has been decided (so every other refusal
comes out exactly as for an unused id); a command that would then start it is refused instead:
``AggregateNotFound`` for commands that may start a stream or continue it (``Stream.ANY``), and for
creation commands (``Stream.NEW``) ``InvalidCommand`` on the id field (type ``id_unavailable``). One id space is shared by all tenants, so the id being unusable cannot be hidden
from someone who already knows it; the refusal says no more than that: not that it exists, nor its
type, owner, version or content (``AggregateAlreadyExists`` stays for the tenant's own streams).

``dispatch_many``: a batch caller's commands (the CLI's stdin), each dispatched exactly as by ``dispatch``
and atomic on its own, several at once so that their appends share group-commit transactions. The
commands run in waves of mutually independent ones, in input order: a command that touches an
aggregate id or an idempotency key an earlier command of the wave touches starts a new wave, which
begins only when the previous one has finished. So every result is the one sequential dispatching
would give.

Observing: every dispatch reports its outcome once to the processor's ``DispatchObserver`` (applied,
replayed, refused with the error's code, or failed), with its duration, and each re-run after the stream
moved as a retry. The default observer does nothing; composition wires the Prometheus one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Protocol
from uuid import UUID, uuid5

import orjson
from pydantic_core import to_jsonable_python

from commitline.application.boundary import (
    CommandLimits,
    check_idempotency_key,
    check_tenant,
    idempotency_key_or_none,
    problem,
)
from commitline.application.catalog import CommandCatalog, Handler, Stream
from commitline.application.commands import Command, VersionedCommand, parse_command
from commitline.application.errors import (
    AggregateAlreadyExists,
    AggregateNotFound,
    CommitlineError,
    ConcurrencyConflict,
    ConfigurationError,
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
from commitline.application.results import DispatchResult, RecordedEventView
from commitline.application.retry import RetryPolicy
from commitline.domain import Aggregate, Event

_DERIVED_ID_NAMESPACE = UUID("0b7e5a0c-2f4e-4f8e-9d61-6a1f3c2b9e77")


class _Unverified(Exception):
    """A run on a cached copy (no read) ended without an answer: decide again on a read."""


def fingerprint(command: Command) -> bytes:
    """SHA-256 of the command's canonical JSON: same request, same fingerprint."""
    canonical = orjson.dumps(command.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).digest()


def _nothing() -> None:
    pass


APPLIED, REPLAYED, REFUSED, FAILED = "applied", "replayed", "refused", "failed"
UNKNOWN_TYPE = "unknown"  # the type reported for a command whose type is not one of the domain's


class DispatchObserver:
    """What ``dispatch`` reports (for metrics): each outcome once, and each re-run after the stream moved.
    This one ignores everything; an implementation must be cheap and must not raise.

    ``command_type`` is always one of the domain's command types or ``"unknown"`` (never text from the caller);
    ``outcome`` is ``applied``, ``replayed``, ``refused`` (a typed refusal: ``code`` says which) or
    ``failed`` (the store or the configuration failed, or an unexpected error: ``code`` says which)."""

    def on_retry(self, command_type: str) -> None:
        pass

    def on_outcome(self, command_type: str, outcome: str, code: str | None, seconds: float) -> None:
        pass


class DispatchTracing(Protocol):
    """Traces of dispatches (``infrastructure/tracing.py``): a span current while the command runs, and the
    observer (wrapping ``observer``) that writes the outcome on it. None on the processor: no tracing at all."""

    def dispatch(self, tenant: object, observer: DispatchObserver) -> AbstractContextManager[DispatchObserver]: ...


def _reported_type(catalog: CommandCatalog, command: object, error: BaseException | None = None) -> str:
    """The command's type if it is one of ``catalog``'s, else ``unknown``."""
    name = command.type if isinstance(command, Command) else getattr(error, "command_type", None)
    if name is None and isinstance(command, Mapping):
        name = command.get("type")
    return name if isinstance(name, str) and name in catalog.known_types else UNKNOWN_TYPE


class CommandProcessor:
    def __init__(self, store: EventStore, catalog: CommandCatalog, retry: RetryPolicy | None = None,
                 limits: CommandLimits | None = None, observer: DispatchObserver | None = None,
                 enter_thread: Callable[[], None] | None = None, tracing: DispatchTracing | None = None):
        self.store = store
        self.catalog = catalog
        self.retry = retry or RetryPolicy()
        self.limits = limits or CommandLimits()
        self.observer = observer or DispatchObserver()
        self.enter_thread = enter_thread or _nothing  # run by the dispatching thread first (e.g. its CPU)
        self.tracing = tracing

    def dispatch(
        self,
        command: Command | Mapping[str, Any] | str | bytes,
        *,
        idempotency_key: str | None,
        tenant: str = "default",
    ) -> DispatchResult:
        return self._observed(command, None, idempotency_key, tenant)

    def dispatch_many(self, items: Sequence[tuple[Command | Mapping[str, Any] | str | bytes, str | None, str]], *,
                      concurrency: int = 32) -> list[DispatchResult | CommitlineError]:
        """Dispatch each (command, idempotency_key, tenant); per item its result or its typed error, in order.

        An unexpected (untyped) error is raised once the wave it happened in has finished."""
        outcomes: list[DispatchResult | CommitlineError | None] = [None] * len(items)
        wave: list[tuple[int, Command]] = []
        touched: set[object] = set()
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(items))),
                                thread_name_prefix="dispatch-many") as pool:
            for index, (command, key, tenant) in enumerate(items):
                try:
                    cmd = parse_command(command, self.catalog, limits=self.limits)
                except CommitlineError:  # refused before any I/O: dispatch reports it as usual
                    outcomes[index] = self._outcome(command, None, key, tenant)
                    continue
                tokens = self._touches(cmd, key, tenant)
                if not touched.isdisjoint(tokens):
                    self._run_wave(pool, wave, items, outcomes)
                    wave, touched = [], set()
                wave.append((index, cmd))
                touched.update(tokens)
            self._run_wave(pool, wave, items, outcomes)
        return outcomes  # type: ignore[return-value]  # every item has its outcome

    def _run_wave(self, pool: ThreadPoolExecutor, wave: list[tuple[int, Command]],
                  items: Sequence[tuple[Any, str | None, str]],
                  outcomes: list[DispatchResult | CommitlineError | None]) -> None:
        if len(wave) == 1:  # nothing to overlap with: no hand-over to a thread
            index, cmd = wave[0]
            outcomes[index] = self._outcome(items[index][0], cmd, items[index][1], items[index][2])
            return
        futures = [(index, pool.submit(self._outcome, items[index][0], cmd, items[index][1], items[index][2]))
                   for index, cmd in wave]
        for index, future in futures:  # result() re-raises an unexpected error, after the whole wave is done
            outcomes[index] = future.result()

    def _outcome(self, command: Any, cmd: Command | None, key: str | None,
                 tenant: str) -> DispatchResult | CommitlineError:
        try:
            return self._observed(command, cmd, key, tenant)
        except CommitlineError as e:
            return e

    def _touches(self, cmd: Command, key: object, tenant: object) -> set[object]:
        """What a command may read or write: every id it names, its target stream (derived ids included)
        and its (tenant, key). Only hashable text is used: an unusable key or tenant is refused anyway."""
        tokens: set[object] = {value for _, value in cmd if isinstance(value, UUID)}
        tokens.add(("key", tenant if isinstance(tenant, str) else None, idempotency_key_or_none(key)))
        target = self.catalog.handler(type(cmd)).target(cmd)
        if target is not None:
            tokens.add(target)
        elif (usable := idempotency_key_or_none(key)) is not None and isinstance(tenant, str):
            tokens.add(uuid5(_DERIVED_ID_NAMESPACE, f"{tenant}\x00{usable}"))
        return tokens

    def _observed(self, command: Any, cmd: Command | None, idempotency_key: str | None,
                  tenant: str) -> DispatchResult:
        self.enter_thread()
        if self.tracing is None:
            return self._reported(self.observer, command, cmd, idempotency_key, tenant)
        with self.tracing.dispatch(tenant, self.observer) as observer:
            return self._reported(observer, command, cmd, idempotency_key, tenant)

    def _reported(self, observer: DispatchObserver, command: Any, cmd: Command | None, idempotency_key: str | None,
                  tenant: str) -> DispatchResult:
        started, command_type = time.perf_counter(), None
        try:
            if cmd is None:
                cmd = parse_command(command, self.catalog, limits=self.limits)
            command_type = cmd.type
            result = self._dispatch(cmd, idempotency_key, tenant, observer)
        except CommitlineError as e:
            failed = isinstance(e, (StoreUnavailable, ConfigurationError))
            observer.on_outcome(command_type or _reported_type(self.catalog, command, e), FAILED if failed else REFUSED,
                                e.code, time.perf_counter() - started)
            raise
        except Exception:
            observer.on_outcome(command_type or _reported_type(self.catalog, command), FAILED, "internal_error",
                                time.perf_counter() - started)
            raise
        observer.on_outcome(command_type, REPLAYED if result.replayed else APPLIED, None,
                            time.perf_counter() - started)
        return result

    def _dispatch(self, cmd: Command, idempotency_key: str | None, tenant: str,
                  observer: DispatchObserver) -> DispatchResult:
        key = check_idempotency_key(idempotency_key, cmd.type)
        tenant = check_tenant(tenant)
        digest = fingerprint(cmd)
        handler = self.catalog.handler(type(cmd))
        aggregate_id = handler.target(cmd) or uuid5(_DERIVED_ID_NAMESPACE, f"{tenant}\x00{key}")
        expected = cmd.expected_version if isinstance(cmd, VersionedCommand) else None

        def load(cls: type[Aggregate], other_id: UUID) -> Aggregate:
            return self._load_existing(cls, other_id, tenant)

        def attempt(trust_cache: bool) -> DispatchResult:
            # The key's record and the aggregate in one read (a used key answers before any other check),
            # or, with ``trust_cache``, the store's cached copy and no read at all (``loaded.verified`` False).
            loaded = self.store.load_for_command(handler.aggregate, aggregate_id, tenant=tenant, key=key,
                                                 trust_cache=trust_cache)
            try:
                if loaded.earlier is None:
                    aggregate = self._checked(handler, loaded, aggregate_id, expected)
                    changed = handler.run(aggregate, cmd, load)
                    if loaded.foreign:  # decided as if the stream were empty; it is another tenant's: not ours
                        raise self._unavailable(handler, cmd, aggregate_id)
            except StoreUnavailable:
                raise  # not a refusal: looking for a twin would only wait for the store again
            except CommitlineError:
                if not loaded.verified:
                    raise _Unverified from None  # refused on a copy that may be stale: read, then decide
                # A twin with this key may have committed since our lookup, changing the state we
                # just refused: its outcome is the answer for this key.
                twin = self._earlier_outcome(tenant, key, digest)
                if twin is not None:
                    return twin
                raise
            if loaded.earlier is not None:
                return self._outcome_of(loaded.earlier, digest)
            events = changed.collect_events()
            result = self._result(cmd, tenant, changed, events)
            record = IdempotencyRecord(tenant, key, digest, cmd.type, aggregate_id, changed.version, result.outcome_bytes())
            try:
                self.store.append(changed, events, tenant=tenant, idempotency=record)
                return result
            except KeyAlreadyRecorded:
                twin = self._earlier_outcome(tenant, key, digest)
                assert twin is not None, "a committed idempotency record must be readable"
                return twin
            except StreamMoved:
                if not loaded.verified:
                    self.store.distrust(aggregate_id)  # another writer: from now on, read before deciding
                    observer.on_retry(cmd.type)
                    raise _Unverified from None
                if expected is not None:
                    # Lost to a twin with this key (a retry racing its own first try)? Its outcome answers.
                    twin = self._earlier_outcome(tenant, key, digest)
                    if twin is not None:
                        return twin
                    raise self._lost_race(handler, aggregate_id, expected, tenant) from None
                raise  # re-run after a jittered back-off
            except CommitlineError:
                if not loaded.verified:
                    raise _Unverified from None  # e.g. too large: a used key's outcome still comes first
                raise

        # The first run may decide on the cached copy without a read; if that run ends without an answer,
        # it is run again at once with a read (not counted: nothing was contended yet). At most
        # ``max_attempts`` runs with a read, each re-run after the stream moved after a jittered pause.
        policy, trust_cache, n = self.retry, True, 1
        while True:
            try:
                return attempt(trust_cache)
            except _Unverified:
                trust_cache = False
            except StreamMoved:
                if n == policy.max_attempts:  # it moved under every attempt
                    raise ConcurrencyConflict(aggregate_id, None, self.store.stream_version(aggregate_id),
                                              n) from None
                observer.on_retry(cmd.type)
                time.sleep(policy.pause(n))
                trust_cache, n = False, n + 1

    def _earlier_outcome(self, tenant: str, key: str, digest: bytes) -> DispatchResult | None:
        record = self.store.find_outcome(tenant, key)
        return None if record is None else self._outcome_of(record, digest)

    @staticmethod
    def _outcome_of(record: IdempotencyRecord, digest: bytes) -> DispatchResult:
        """The stored outcome of a key, if it was used for this same request."""
        if record.fingerprint != digest:
            raise IdempotencyKeyReused(record.tenant, record.key, record.command_type)
        return DispatchResult.from_outcome(record.outcome)

    def _load_existing(self, cls: type[Aggregate], aggregate_id: UUID, tenant: str) -> Aggregate:
        """Another aggregate a command reads: it must exist and be the tenant's own."""
        try:
            aggregate = self.store.load(cls, aggregate_id, tenant=tenant)
        except ForeignStream:
            raise AggregateNotFound(cls.__name__, aggregate_id) from None
        if not aggregate.exists:
            raise AggregateNotFound(cls.__name__, aggregate_id)
        return aggregate

    @staticmethod
    def _checked(handler: Handler, loaded: CommandLoad, aggregate_id: UUID, expected: int | None) -> Aggregate:
        """The aggregate the command changes, if its stream is as the command needs it (a blank stand-in
        when the stream is another tenant's, so every check here behaves exactly as for an unused id)."""
        aggregate = loaded.aggregate
        assert aggregate is not None
        name = handler.aggregate.__name__
        if handler.stream is Stream.NEW and aggregate.exists:
            raise AggregateAlreadyExists(name, aggregate_id)
        if handler.stream is Stream.EXISTING and not aggregate.exists:
            raise AggregateNotFound(name, aggregate_id)
        if expected is not None and aggregate.version != expected:
            raise ConcurrencyConflict(aggregate_id, expected, aggregate.version)
        return aggregate

    @staticmethod
    def _unavailable(handler: Handler, cmd: Command, aggregate_id: UUID) -> CommitlineError:
        """The refusal of a command that would start a stream at an id another tenant's stream has."""
        if handler.stream is not Stream.NEW:
            return AggregateNotFound(handler.aggregate.__name__, aggregate_id)
        loc: list[str | int] = [name for name, value in cmd if value == aggregate_id][:1]
        return InvalidCommand(cmd.type, [problem(
            loc, "this id cannot be used: choose another one, or leave it out to have one derived from the "
            "idempotency key", "id_unavailable")])

    def _lost_race(self, handler: Handler, aggregate_id: UUID, expected: int, tenant: str) -> CommitlineError:
        """The refusal of a command with ``expected_version`` whose append lost the stream's next version:
        the version it lost to, read tenant-scoped, so a stream another tenant started meanwhile stays unseen."""
        try:
            actual = self.store.load(handler.aggregate, aggregate_id, tenant=tenant).version
        except ForeignStream:
            return AggregateNotFound(handler.aggregate.__name__, aggregate_id)
        return ConcurrencyConflict(aggregate_id, expected, actual)

    @staticmethod
    def _result(cmd: Command, tenant: str, aggregate: Aggregate, events: list[Event]) -> DispatchResult:
        aggregate_type = type(aggregate).__name__
        return DispatchResult(
            command_type=cmd.type,
            tenant=tenant,
            aggregate_type=aggregate_type,
            aggregate_id=aggregate.id,
            version=aggregate.version,
            events=tuple(
                RecordedEventView(
                    event_id=e.event_id,
                    type=e.type_name(),
                    aggregate_type=aggregate_type,
                    aggregate_id=e.aggregate_id,
                    version=e.version,
                    occurred_at=e.occurred_at,
                    tenant=tenant,
                    payload=to_jsonable_python(e.payload()),
                )
                for e in events
            ),
        )
