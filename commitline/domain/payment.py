"""The payment transaction aggregate (seed 002): CREATED -> PENDING -> COMPLETED | FAILED."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from uuid import UUID

from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.errors import IllegalTransition, InvalidValue
from commitline.domain.fsm import table
from commitline.domain.money import check_amount, check_currency


class PaymentState(str, Enum):
    CREATED = "CREATED"
    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


C, P, OK, KO = PaymentState.CREATED, PaymentState.PENDING, PaymentState.COMPLETED, PaymentState.FAILED
PAYMENT_TRANSITIONS = table("PaymentTransaction", {C: {P}, P: {OK, KO}, OK: set(), KO: {P}})


@dataclass(frozen=True, kw_only=True)
class PaymentCreated(Event):
    amount: Decimal
    currency: str
    account: str


@dataclass(frozen=True, kw_only=True)
class PaymentSubmitted(Event):
    """Moved to PENDING: first submission, or a retry after a failure."""

    attempt: int


@dataclass(frozen=True, kw_only=True)
class PaymentCompleted(Event):
    pass


@dataclass(frozen=True, kw_only=True)
class PaymentFailed(Event):
    reason: str


@dataclass(kw_only=True)
class PaymentTransaction(Aggregate):
    state: PaymentState | None = None
    amount: Decimal = Decimal(0)
    currency: str = ""
    account: str = ""
    attempts: int = 0
    failure_reason: str | None = None

    EVENTS = (PaymentCreated, PaymentSubmitted, PaymentCompleted, PaymentFailed)
    TRANSITIONS = PAYMENT_TRANSITIONS

    @classmethod
    def create(cls, payment_id: UUID, *, amount: Decimal, currency: str, account: str) -> PaymentTransaction:
        check_amount(amount, check_currency(currency))
        if not account.strip():
            raise InvalidValue("account", account, "must not be blank")
        payment = cls.blank(payment_id)
        payment._emit(PaymentCreated, amount=amount, currency=currency, account=account)
        return payment

    def submit(self) -> None:
        self._move_to(PaymentState.PENDING)
        self._emit(PaymentSubmitted, attempt=self.attempts + 1)

    def complete(self) -> None:
        self._move_to(PaymentState.COMPLETED)
        self._emit(PaymentCompleted)

    def fail(self, reason: str) -> None:
        self._move_to(PaymentState.FAILED)
        self._emit(PaymentFailed, reason=reason)

    def fsm_states(self) -> dict[str, str]:
        return {"payment": self.state.value} if self.state else {}

    def _move_to(self, target: PaymentState) -> None:
        if self.state is None:
            raise IllegalTransition("PaymentTransaction", "NEW", target.value, ())
        PAYMENT_TRANSITIONS.check(self.state, target)

    def _evolve(self, event: Event) -> None:
        match event:
            case PaymentCreated(amount=amount, currency=currency, account=account):
                self.state, self.amount, self.currency, self.account = C, amount, currency, account
            case PaymentSubmitted(attempt=attempt):
                self.state, self.attempts, self.failure_reason = P, attempt, None
            case PaymentCompleted():
                self.state = OK
            case PaymentFailed(reason=reason):
                self.state, self.failure_reason = KO, reason
            case _:
                raise TypeError(f"PaymentTransaction cannot apply {type(event).__name__}")
