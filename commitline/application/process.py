"""Process managers (sagas): react to events of the log by dispatching commands, exactly once each.

A process manager is a class of the domain's. ``triggers`` are the event types it reacts to;
``instance_of`` says which instance an event concerns (by default the event's aggregate id), and
``advance(instance_id, tenant)`` moves that instance as far as it can go. ``advance`` must be safe to
call again at any moment, including after a crash half-way through: every command it dispatches carries
an idempotency key derived from the instance and the step (``dispatch(command, key, tenant)``), so a
repeat replays the first outcome, and external systems are called through ports under keys of the same
kind (``self.ports[name]``). Its progress is recorded as events of an aggregate of its own.

The runner (``commitline sagas run``) advances the instances a batch of events triggers, several at
once; one that keeps failing with an error no step handles is tried ``attempts`` times with back-off,
then handed to ``park`` and the batch moves on: one instance's failure never holds up the others. An
operator resumes it with ``retry`` (``commitline sagas retry``). ``stuck`` lists the instances waiting
for a person (for ``status``, the status page and metrics); ``instances`` what ``sagas list`` shows.

Everything an instance does happens as the tenant of the event that triggered it: each command is
dispatched, and each aggregate read, under it, so an instance never sees or touches another tenant's
streams.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar
from uuid import UUID

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from commitline.application.commands import Command
from commitline.application.errors import AggregateNotFound
from commitline.application.ports import EventStore, ForeignStream
from commitline.application.results import DispatchResult
from commitline.domain.aggregate import Aggregate, Event

A = TypeVar("A", bound=Aggregate)
Boundary = Callable[[str], None]


class Dispatcher:
    """What a process manager dispatches through: the command processor's ``dispatch``."""

    def dispatch(self, command: Any, *, idempotency_key: str | None, tenant: str = "default") -> DispatchResult:
        raise NotImplementedError


@dataclass(frozen=True)
class StuckInstance:
    """An instance waiting for a person: ``subject`` and ``problem`` are how ``status`` words it."""

    saga: str
    id: UUID
    tenant: str
    state: str
    reason: str
    subject: str = ""
    problem: str = ""

    def __post_init__(self) -> None:
        if not self.subject:
            object.__setattr__(self, "subject", f"{self.saga} {self.id}")
        if not self.problem:
            object.__setattr__(self, "problem", f"{self.state}: {self.reason}")


@dataclass(frozen=True)
class InstanceRow:
    """One instance as ``sagas list`` shows it."""

    id: UUID
    tenant: str
    state: str
    detail: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


class NotParked(RuntimeError):
    """An instance kept failing, and its process manager records no parked instances (``park`` is not
    overridden): its runner must not pass over the event that triggered it."""

    def __init__(self, manager: str, instance_id: UUID, attempts: int, reason: str):
        super().__init__(f"{manager} {instance_id} kept failing after {attempts} attempts: {reason} ({manager} "
                         "parks no instance, so its runner retries until the cause is fixed; override park to "
                         "record the failure on the instance's own aggregate and go on with the others)")


class ParkFailed(NotParked):
    """An instance kept failing, and recording it as parked failed too (``park`` raised): passing it over would lose
    it, so its runner holds at the event that triggered it, as for ``NotParked``, until the cause is fixed."""

    def __init__(self, manager: str, instance_id: UUID, attempts: int, reason: str, park_error: str):
        RuntimeError.__init__(self, f"{manager} {instance_id} kept failing after {attempts} attempts: {reason}; and "
                              f"parking it failed too: {park_error} (its runner retries the instance until the cause "
                              "is fixed, passing nothing over)")


class ProcessManager:
    """Base of a domain's process managers; see the module's docstring. Subclasses set ``name`` (also the
    runner's follower name, shown by ``status``) and ``triggers``, and implement ``advance``."""

    name: ClassVar[str]
    triggers: ClassVar[tuple[type[Event], ...]] = ()
    #: read models ``sagas run`` keeps up to date beside the runner (those ``stuck`` and ``instances`` read)
    read_models: ClassVar[tuple[str, ...]] = ()

    def __init__(self, processor: Dispatcher, store: EventStore, ports: Mapping[str, Any] | None = None, *,
                 attempts: int = 3, backoff: float = 0.05, on_boundary: Boundary | None = None):
        self.processor = processor
        self.store = store
        self.ports: Mapping[str, Any] = dict(ports or {})
        self.attempts = attempts
        self.backoff = backoff
        self.on_boundary = on_boundary or (lambda _: None)

    # -- what a subclass decides ---------------------------------------------------------

    def instance_of(self, event: Event, tenant: str) -> UUID:
        """The instance ``event`` concerns (by default the id of the aggregate that recorded it)."""
        return event.aggregate_id

    def advance(self, instance_id: UUID, tenant: str) -> str:
        """Move the instance as far as it goes; return the state it stopped in."""
        raise NotImplementedError(f"{type(self).__name__} must implement advance(instance_id, tenant)")

    def park(self, instance_id: UUID, reason: str, attempts: int, tenant: str) -> None:
        """Record that advancing kept failing (with ``reason``): the instance waits for ``retry``, and the runner
        goes on with the others. Override it to record that as an event of the instance's own aggregate (durable,
        listed by ``stuck``, resumed by ``retry``). A process manager that does not records nothing, so passing the
        instance over would lose it: ``NotParked`` stops its runner at the event instead (``retrying``, the
        reason in ``status``), and it advances again until the cause is fixed."""
        raise NotParked(self.name, instance_id, attempts, reason)

    def retry(self, instance_id: UUID, tenant: str, key: str) -> str:
        """An operator's retry of a parked or stuck instance (``key`` is unique per request); returns where
        it resumes. By default there is nothing to retry."""
        raise AggregateNotFound(f"parked or stuck {self.name}", instance_id)

    def stuck(self, reads: Any, tenant: str | None = None) -> list[StuckInstance]:
        """The instances waiting for a person (of ``tenant``, or of every tenant)."""
        return []

    def instances(self, reads: Any, *, stuck_only: bool = False, tenant: str | None = None) -> list[InstanceRow]:
        """The instances ``sagas list`` shows."""
        return [InstanceRow(s.id, s.tenant, s.state, s.reason) for s in self.stuck(reads, tenant)]

    def describe(self, row: Any) -> str:
        """One line of ``sagas list`` for a row ``instances`` returned."""
        return f"{row.id}  tenant {row.tenant}  {row.state:<12} {row.detail}"

    def history_of(self, instance_id: UUID) -> UUID:
        """The aggregate whose history ``sagas show`` prints for an instance (by default the instance id)."""
        return instance_id

    # -- helpers for subclasses ----------------------------------------------------------

    def dispatch(self, command: Command, key: str, tenant: str) -> DispatchResult:
        return self.processor.dispatch(command, idempotency_key=key, tenant=tenant)

    def load(self, cls: type[A], aggregate_id: UUID, tenant: str) -> A:
        """``cls`` as the tenant sees it: another tenant's stream does not exist (AggregateNotFound); a blank
        aggregate (version 0) when nobody wrote it yet."""
        try:
            return self.store.load(cls, aggregate_id, tenant=tenant)
        except ForeignStream:
            raise AggregateNotFound(cls.__name__, aggregate_id) from None

    def retrying(self, call: Callable[[], Any], retry_on: type[BaseException] | tuple[type[BaseException], ...]
                 = Exception) -> Any:
        """``call()``, repeated while it raises ``retry_on``, at most ``attempts`` times, pausing ``backoff``
        seconds, doubled per retry; the last error is re-raised."""
        return Retrying(stop=stop_after_attempt(self.attempts), wait=wait_exponential(multiplier=self.backoff),
                        retry=retry_if_exception_type(retry_on), reraise=True)(call)
