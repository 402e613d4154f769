"""The durable progress of an order's fulfilment saga (seed 001's third lesson).

``OrderFulfilment`` is the saga's own event-sourced record: every step taken and every
compensation made is an event, so after a crash the process manager continues from
exactly what was recorded. Steps: reserve stock -> authorize the payment -> confirm the
order and capture the payment. A failed step moves it to COMPENSATING; compensations run
in reverse; one that keeps failing moves it to STUCK for a person to resolve. The saga's
id and the id of the payment it creates both derive from the order id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from uuid import UUID, uuid5

from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.errors import InvalidValue
from commitline.domain.fsm import table

_SAGA_NAMESPACE = UUID("8d2f4b61-0c5e-4f0a-9b7d-3e6a1c9f2d58")
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


def fulfilment_id(order_id: UUID) -> UUID:
    return uuid5(_SAGA_NAMESPACE, str(order_id))


def payment_id_for(order_id: UUID) -> UUID:
    return uuid5(_SAGA_NAMESPACE, f"payment/{order_id}")


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
    resumed: SagaState = SagaState.COMPENSATING  # where the saga goes on: COMPENSATING after STUCK, else where it was parked


@dataclass(kw_only=True)
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
