"""Orders and the durable progress of their fulfilment saga (seed 001's third lesson).

``Order``: PLACED -> CONFIRMED | CANCELLED, CONFIRMED -> CANCELLED (a compensation).

``OrderFulfilment`` is the saga's own event-sourced record: every step taken and every
compensation made is an event, so after a crash the process manager continues from
exactly what was recorded. Steps: reserve stock -> authorize the payment -> confirm the
order and capture the payment. A failed step moves it to COMPENSATING; compensations run
in reverse; one that keeps failing moves it to STUCK for a person to resolve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from uuid import UUID, uuid5

from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.errors import InvalidValue
from commitline.domain.fsm import table
from commitline.domain.money import check_amount, check_currency

_SAGA_NAMESPACE = UUID("8d2f4b61-0c5e-4f0a-9b7d-3e6a1c9f2d58")
STEPS = ("reserve", "charge", "confirm")


class OrderState(str, Enum):
    PLACED = "PLACED"
    CONFIRMED = "CONFIRMED"
    CANCELLED = "CANCELLED"


ORDER_TRANSITIONS = table("Order", {
    OrderState.PLACED: {OrderState.CONFIRMED, OrderState.CANCELLED},
    OrderState.CONFIRMED: {OrderState.CANCELLED},
    OrderState.CANCELLED: set(),
})


@dataclass(frozen=True, kw_only=True)
class OrderPlaced(Event):
    item_id: UUID
    quantity: int
    amount: Decimal
    currency: str
    account: str


@dataclass(frozen=True, kw_only=True)
class OrderConfirmed(Event):
    pass


@dataclass(frozen=True, kw_only=True)
class OrderCancelled(Event):
    reason: str


@dataclass(kw_only=True)
class Order(Aggregate):
    state: OrderState | None = None
    item_id: UUID | None = None
    quantity: int = 0
    amount: Decimal = Decimal(0)
    currency: str = ""
    account: str = ""
    cancel_reason: str | None = None

    EVENTS = (OrderPlaced, OrderConfirmed, OrderCancelled)
    TRANSITIONS = ORDER_TRANSITIONS

    @classmethod
    def place(cls, order_id: UUID, *, item_id: UUID, quantity: int, amount: Decimal, currency: str,
              account: str) -> Order:
        if quantity <= 0:
            raise InvalidValue("quantity", quantity, "must be greater than zero")
        check_amount(amount, check_currency(currency))
        order = cls.blank(order_id)
        order._emit(OrderPlaced, item_id=item_id, quantity=quantity, amount=amount, currency=currency, account=account)
        return order

    def confirm(self) -> None:
        self._move_to(OrderState.CONFIRMED)
        self._emit(OrderConfirmed)

    def cancel(self, reason: str) -> None:
        self._move_to(OrderState.CANCELLED)
        self._emit(OrderCancelled, reason=reason)

    def fsm_states(self) -> dict[str, str]:
        return {"order": self.state.value} if self.state else {}

    def _move_to(self, target: OrderState) -> None:
        assert self.state is not None
        ORDER_TRANSITIONS.check(self.state, target)

    def _evolve(self, event: Event) -> None:
        match event:
            case OrderPlaced(item_id=item_id, quantity=quantity, amount=amount, currency=currency, account=account):
                self.state, self.item_id, self.quantity = OrderState.PLACED, item_id, quantity
                self.amount, self.currency, self.account = amount, currency, account
            case OrderConfirmed():
                self.state = OrderState.CONFIRMED
            case OrderCancelled(reason=reason):
                self.state, self.cancel_reason = OrderState.CANCELLED, reason
            case _:
                raise TypeError(f"Order cannot apply {type(event).__name__}")


class SagaState(str, Enum):
    STARTED = "STARTED"
    RESERVED = "RESERVED"
    AUTHORIZED = "AUTHORIZED"
    COMPLETED = "COMPLETED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    STUCK = "STUCK"


S = SagaState
SAGA_TRANSITIONS = table("OrderFulfilment", {
    S.STARTED: {S.RESERVED, S.COMPENSATING},
    S.RESERVED: {S.AUTHORIZED, S.COMPENSATING},
    S.AUTHORIZED: {S.COMPLETED, S.COMPENSATING},
    S.COMPENSATING: {S.COMPENSATED, S.STUCK},
    S.STUCK: {S.COMPENSATING},  # an operator retries after fixing the cause
    S.COMPLETED: set(),
    S.COMPENSATED: set(),
})
AFTER_STEP = {"reserve": S.RESERVED, "charge": S.AUTHORIZED, "confirm": S.COMPLETED}


def fulfilment_id(order_id: UUID) -> UUID:
    return uuid5(_SAGA_NAMESPACE, str(order_id))


def payment_id_for(order_id: UUID) -> UUID:
    return uuid5(_SAGA_NAMESPACE, f"payment/{order_id}")


@dataclass(frozen=True, kw_only=True)
class FulfilmentStarted(Event):
    order_id: UUID


@dataclass(frozen=True, kw_only=True)
class FulfilmentStepCompleted(Event):
    step: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class FulfilmentStepFailed(Event):
    step: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class FulfilmentCompensated(Event):
    """One completed step undone."""

    step: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class FulfilmentCancelled(Event):
    """Every compensation done and the order cancelled: the saga is over."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class FulfilmentStuck(Event):
    step: str
    reason: str
    attempts: int


@dataclass(frozen=True, kw_only=True)
class FulfilmentRetried(Event):
    pass


@dataclass(kw_only=True)
class OrderFulfilment(Aggregate):
    state: SagaState | None = None
    order_id: UUID | None = None
    completed: list[str] = field(default_factory=list)
    failed_step: str | None = None
    compensated: list[str] = field(default_factory=list)
    failure: str | None = None
    stuck: str | None = None

    EVENTS = (FulfilmentStarted, FulfilmentStepCompleted, FulfilmentStepFailed, FulfilmentCompensated,
              FulfilmentCancelled, FulfilmentStuck, FulfilmentRetried)
    TRANSITIONS = SAGA_TRANSITIONS

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
        self._move(AFTER_STEP[step])
        self._emit(FulfilmentStepCompleted, step=step, detail=detail)

    def step_failed(self, step: str, reason: str) -> None:
        self._check_step(step)
        self._move(S.COMPENSATING)
        self._emit(FulfilmentStepFailed, step=step, reason=reason)

    def compensated_step(self, step: str, detail: str) -> None:
        if self.state is not S.COMPENSATING or step not in self.to_compensate[:1]:
            raise InvalidValue("step", step, f"is not the next step to undo (next: {self.to_compensate[:1]})")
        self._emit(FulfilmentCompensated, step=step, detail=detail)

    def cancelled(self, reason: str) -> None:
        if self.to_compensate:
            raise InvalidValue("compensation", self.to_compensate, "steps are still to be undone")
        self._move(S.COMPENSATED)
        self._emit(FulfilmentCancelled, reason=reason)

    def stuck_at(self, step: str, reason: str, attempts: int) -> None:
        self._move(S.STUCK)
        self._emit(FulfilmentStuck, step=step, reason=reason, attempts=attempts)

    def retry(self) -> None:
        self._move(S.COMPENSATING)
        self._emit(FulfilmentRetried)

    def fsm_states(self) -> dict[str, str]:
        return {"saga": self.state.value} if self.state else {}

    def _check_step(self, step: str) -> None:
        if step != self.next_step:
            raise InvalidValue("step", step, f"the next step is {self.next_step}")

    def _move(self, target: SagaState) -> None:
        assert self.state is not None
        SAGA_TRANSITIONS.check(self.state, target)

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
            case FulfilmentRetried():
                self.state, self.stuck = S.COMPENSATING, None
            case _:
                raise TypeError(f"OrderFulfilment cannot apply {type(event).__name__}")
