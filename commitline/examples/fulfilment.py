"""The durable progress of an order's fulfilment saga (seed 001's third lesson).

``OrderFulfilment`` is the saga's own event-sourced record: every step taken and every
compensation made is an event, so after a crash the process manager continues from
exactly what was recorded. Steps: reserve stock -> authorize the payment -> confirm the
order and capture the payment. A failed step moves it to COMPENSATING; compensations run
in reverse; one that keeps failing moves it to STUCK for a person to resolve. The saga's
id and the id of the payment it creates both derive from the order id.

The slice: the saga's aggregate with its events and table, the commands only the process manager
issues (``internal``: never accepted from HTTP or the CLI) and their handlers, and the
``order_fulfilments`` read model with its queries. The process manager itself is ``fulfilment_saga``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, field
from enum import Enum
from typing import Annotated, Any
from uuid import UUID

from pydantic import Field

from commitline import (Aggregate, AggregateNotFound, Changes, Command, Domain, DomainError, Event, Id, InvalidValue,
                        Loader, Projection, RecordedEvent, Stream, Table, Text, on, table)
from commitline.examples.orders import Order
from commitline.examples.reads import (ExampleReads, FulfilmentOut, FulfilmentsOut, fulfilment_id,  # noqa: F401
                                      payment_id_for)  # the saga's and its users' name for it

domain = Domain("fulfilment")
STEPS = ("reserve", "charge", "confirm")


class SagaState(str, Enum):
    STARTED = "STARTED"
    RESERVED = "RESERVED"
    AUTHORIZED = "AUTHORIZED"
    COMPLETED = "COMPLETED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    STUCK = "STUCK"
    PARKED = "PARKED"


S = SagaState
SAGA_TRANSITIONS = table("OrderFulfilment", {
    S.STARTED: {S.RESERVED, S.COMPENSATING, S.PARKED},
    S.RESERVED: {S.AUTHORIZED, S.COMPENSATING, S.PARKED},
    S.AUTHORIZED: {S.COMPLETED, S.COMPENSATING, S.PARKED},
    S.COMPENSATING: {S.COMPENSATED, S.STUCK, S.PARKED},
    S.STUCK: {S.COMPENSATING},  # an operator retries after fixing the cause
    # a saga that kept failing unexpectedly waits for an operator's retry, then resumes where it was
    S.PARKED: {S.STARTED, S.RESERVED, S.AUTHORIZED, S.COMPENSATING},
    S.COMPLETED: set(),
    S.COMPENSATED: set(),
})
AFTER_STEP = {"reserve": S.RESERVED, "charge": S.AUTHORIZED, "confirm": S.COMPLETED}


@domain.error
class FulfilmentNotWaiting(DomainError):
    """An operator's retry of a fulfilment that waits for none: only a STUCK or PARKED one is retried (a retry of
    one still running would cancel its order under it, leaving its payment authorized)."""

    code = "fulfilment_not_waiting"
    status = 409
    fields = ("order_id", "state")
    message = ("the fulfilment of order {order_id} is {state}, not STUCK or PARKED: there is nothing to retry "
               "(`commitline sagas list --stuck` lists those that wait)")


class FulfilmentStarted(Event):
    order_id: UUID


class FulfilmentStepCompleted(Event):
    step: str
    detail: str


class FulfilmentStepFailed(Event):
    step: str
    reason: str


class FulfilmentCompensated(Event):
    """One completed step undone."""

    step: str
    detail: str


class FulfilmentCancelled(Event):
    """Every compensation done and the order cancelled: the saga is over."""

    reason: str


class FulfilmentStuck(Event):
    step: str
    reason: str
    attempts: int


class FulfilmentParked(Event):
    """Advancing the saga kept failing with an error no step handles (a bug, data the gateway cannot take):
    it waits, with the reason, for an operator's retry, while every other saga moves on."""

    order_id: UUID
    reason: str
    attempts: int


class FulfilmentRetried(Event):
    order_id: UUID | None = None  # the order whose saga is retried (None in events recorded before it was added)
    # where the saga goes on: COMPENSATING after STUCK, else where it was parked
    resumed: SagaState = SagaState.COMPENSATING


@domain.aggregate
class OrderFulfilment(Aggregate):
    state: SagaState | None = None
    order_id: UUID | None = None
    completed: list[str] = field(default_factory=list)
    failed_step: str | None = None
    compensated: list[str] = field(default_factory=list)
    failure: str | None = None
    stuck: str | None = None
    parked_from: SagaState | None = None

    EVENTS = (FulfilmentStarted, FulfilmentStepCompleted, FulfilmentStepFailed, FulfilmentCompensated,
              FulfilmentCancelled, FulfilmentStuck, FulfilmentRetried, FulfilmentParked)
    TRANSITIONS = SAGA_TRANSITIONS
    MACHINE = ("saga", "state")

    @classmethod
    def start(cls, order_id: UUID) -> OrderFulfilment:
        saga = cls.blank(fulfilment_id(order_id))
        saga._emit(FulfilmentStarted, order_id=order_id)
        return saga

    @property
    def next_step(self) -> str | None:
        return next((s for s in STEPS if s not in self.completed), None)

    @property
    def to_compensate(self) -> list[str]:
        """Steps not yet undone, latest first: the failed one (it may have left partial effects, such as
        an ambiguous gateway authorization) and every completed one."""
        touched = self.completed + ([self.failed_step] if self.failed_step else [])
        return [s for s in reversed(touched) if s not in self.compensated]

    def step_completed(self, step: str, detail: str) -> None:
        self._check_step(step)
        self._move(AFTER_STEP[step], FulfilmentStepCompleted, step=step, detail=detail)

    def step_failed(self, step: str, reason: str) -> None:
        self._check_step(step)
        self._move(S.COMPENSATING, FulfilmentStepFailed, step=step, reason=reason)

    def compensated_step(self, step: str, detail: str) -> None:
        if self.state is not S.COMPENSATING or step not in self.to_compensate[:1]:
            raise InvalidValue("step", step, f"is not the next step to undo (next: {self.to_compensate[:1]})")
        self._emit(FulfilmentCompensated, step=step, detail=detail)

    def cancelled(self, reason: str) -> None:
        if self.to_compensate:
            raise InvalidValue("compensation", self.to_compensate, "steps are still to be undone")
        self._move(S.COMPENSATED, FulfilmentCancelled, reason=reason)

    def stuck_at(self, step: str, reason: str, attempts: int) -> None:
        self._move(S.STUCK, FulfilmentStuck, step=step, reason=reason, attempts=attempts)

    def park(self, order_id: UUID, reason: str, attempts: int) -> None:
        """Park the saga (starting its stream first if advancing failed before it started)."""
        if self.state is None:
            self._emit(FulfilmentStarted, order_id=order_id)
        self._move(S.PARKED, FulfilmentParked, order_id=order_id, reason=reason, attempts=attempts)

    def retry(self) -> None:
        if self.state is not None and self.state not in (S.STUCK, S.PARKED):  # running (a retry would cancel its
            raise FulfilmentNotWaiting(self.order_id, self.state.value)  # order under it), compensating, or over
        resumed = self.parked_from if self.state is S.PARKED and self.parked_from else S.COMPENSATING
        self._move(resumed, FulfilmentRetried, order_id=self.order_id, resumed=resumed)

    def _check_step(self, step: str) -> None:
        if self.state is S.PARKED:
            raise InvalidValue("step", step, "the saga is parked: retry it first")
        if step != self.next_step:
            raise InvalidValue("step", step, f"the next step is {self.next_step}")

    def _evolve(self, event: Event) -> None:
        match event:
            case FulfilmentStarted(order_id=order_id):
                self.state, self.order_id = S.STARTED, order_id
            case FulfilmentStepCompleted(step=step):
                self.state = AFTER_STEP[step]
                self.completed = [*self.completed, step]
            case FulfilmentStepFailed(step=step, reason=reason):
                self.state, self.failed_step, self.failure = S.COMPENSATING, step, f"{step}: {reason}"
            case FulfilmentCompensated(step=step):
                self.compensated = [*self.compensated, step]
            case FulfilmentCancelled():
                self.state = S.COMPENSATED
            case FulfilmentStuck(step=step, reason=reason):
                self.state, self.stuck = S.STUCK, f"{step}: {reason}"
            case FulfilmentParked(reason=reason):
                self.parked_from, self.state, self.stuck = self.state, S.PARKED, reason
            case FulfilmentRetried(resumed=resumed):
                self.state, self.stuck, self.parked_from = resumed, None, None


# -- the commands only the process manager issues (internal: never accepted as JSON) ----------------------

Reason = Annotated[str, Field(min_length=1, max_length=2000)]
Detail = Annotated[str, Field(max_length=2000)]


class SagaCommand(Command):
    """Recorded by the order-fulfilment process manager only."""

    order_id: Id


class StartFulfilment(SagaCommand):
    pass


class RecordFulfilmentStep(SagaCommand):
    step: Text
    detail: Detail


class RecordFulfilmentFailure(SagaCommand):
    step: Text
    reason: Reason


class RecordCompensation(SagaCommand):
    step: Text
    detail: Detail


class RecordFulfilmentCancelled(SagaCommand):
    reason: Reason


class MarkFulfilmentStuck(SagaCommand):
    step: Text
    reason: Reason
    attempts: Annotated[int, Field(ge=1)]


class RetryFulfilment(SagaCommand):
    pass


class CancelOrderAfterFailure(SagaCommand):
    """The saga's compensation: cancels the order even once confirmed (its capture failed)."""

    reason: Reason


class ParkFulfilment(SagaCommand):
    reason: Reason
    attempts: Annotated[int, Field(ge=1)]


def _saga(cmd: SagaCommand) -> UUID:
    return fulfilment_id(cmd.order_id)


@domain.handles(StartFulfilment, OrderFulfilment, Stream.NEW, id=_saga, internal=True)
def start_fulfilment(saga: OrderFulfilment, cmd: StartFulfilment, load: Loader) -> OrderFulfilment:
    load(Order, cmd.order_id)  # the order must exist
    return OrderFulfilment.start(cmd.order_id)


@domain.handles(ParkFulfilment, OrderFulfilment, Stream.ANY, id=_saga, internal=True)
def park_fulfilment(saga: OrderFulfilment, cmd: ParkFulfilment, load: Loader) -> None:
    load(Order, cmd.order_id)  # the order must exist (a saga may be parked before it started)
    saga.park(cmd.order_id, cmd.reason, cmd.attempts)


domain.handles(CancelOrderAfterFailure, Order, id="order_id", internal=True)(
    lambda order, cmd: order.cancel(cmd.reason, compensation=True))


# The process manager's records of its own progress: each calls one method of the saga aggregate.
SAGA_RECORDS: dict[type[SagaCommand], Callable[[OrderFulfilment, Any], None]] = {
    RecordFulfilmentStep: lambda saga, cmd: saga.step_completed(cmd.step, cmd.detail),
    RecordFulfilmentFailure: lambda saga, cmd: saga.step_failed(cmd.step, cmd.reason),
    RecordCompensation: lambda saga, cmd: saga.compensated_step(cmd.step, cmd.detail),
    RecordFulfilmentCancelled: lambda saga, cmd: saga.cancelled(cmd.reason),
    MarkFulfilmentStuck: lambda saga, cmd: saga.stuck_at(cmd.step, cmd.reason, cmd.attempts),
    RetryFulfilment: lambda saga, cmd: saga.retry(),
}
for _command, _record in SAGA_RECORDS.items():
    domain.handles(_command, OrderFulfilment, id=_saga, internal=True)(_record)


# -- the read model: each order's fulfilment, where it stands, why it failed, whether it is stuck ----------

@domain.read_model
class OrderFulfilments(Projection):
    """Each order's fulfilment saga: where it stands, why it failed, whether it is stuck."""

    name = "order_fulfilments"
    tables = (
        Table("rm_order_fulfilments", {"saga_id": "uuid", "order_id": "uuid", "tenant": "text", "state": "text",
                                       "failure": "text", "stuck": "text"}, key=("saga_id",)),
    )

    def _put(self, changes: Changes, r: RecordedEvent, **values: object) -> None:
        changes.put("rm_order_fulfilments", (r.event.aggregate_id,), **values)

    @on(FulfilmentStarted)
    def started(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, order_id=r.event.order_id, tenant=r.tenant, state=SagaState.STARTED.value)

    @on(FulfilmentStepCompleted)
    def step_completed(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=AFTER_STEP[r.event.step].value)

    @on(FulfilmentStepFailed)
    def step_failed(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=SagaState.COMPENSATING.value, failure=f"{r.event.step}: {r.event.reason}")

    @on(FulfilmentCancelled)
    def cancelled(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=SagaState.COMPENSATED.value)

    @on(FulfilmentStuck)
    def stuck(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=SagaState.STUCK.value,
                  stuck=f"{r.event.step}: {r.event.reason} (after {r.event.attempts} attempts)")

    @on(FulfilmentParked)
    def parked(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, order_id=r.event.order_id, tenant=r.tenant, state=SagaState.PARKED.value,
                  stuck=f"{r.event.reason} (after {r.event.attempts} attempts)")

    @on(FulfilmentRetried)
    def retried(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=r.event.resumed.value, stuck="")


@domain.query("fulfilments", response=FulfilmentsOut,
              summary="The caller's order fulfilments (sagas) and their state; stuck=true: only those waiting for "
                      "a person (STUCK or PARKED)")
def fulfilments(reads: ExampleReads, tenant: str, stuck: bool = False) -> dict[str, object]:
    return {"fulfilments": [asdict(r) for r in reads.fulfilments(stuck_only=stuck, tenant=tenant)]}


@domain.query("fulfilments/{order_id}", response=FulfilmentOut, summary="The fulfilment of one order")
def fulfilment(reads: ExampleReads, tenant: str, order_id: UUID) -> dict[str, object]:
    row = reads.fulfilment(order_id, tenant=tenant)
    if row is None:
        raise AggregateNotFound("fulfilment of order", order_id)
    return asdict(row)
