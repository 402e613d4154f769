"""The payment transaction aggregate (seed 002): CREATED -> PENDING -> COMPLETED | FAILED."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from uuid import UUID

from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.errors import InvalidValue
from commitline.domain.fsm import table
from commitline.domain.money import check_amount, check_currency


class PaymentState(str, Enum):
    CREATED = "CREATED"
    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


C, P, OK, KO = PaymentState.CREATED, PaymentState.PENDING, PaymentState.COMPLETED, PaymentState.FAILED
PAYMENT_TRANSITIONS = table("PaymentTransaction", {C: {P}, P: {OK, KO}, OK: set(), KO: {P}})


class PaymentCreated(Event):
    amount: Decimal
    currency: str
    account: str


class PaymentSubmitted(Event):
    """Moved to PENDING: first submission, or a retry after a failure."""

    attempt: int


class PaymentCompleted(Event):
    """The gateway captured the money: a terminal state."""


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
    MACHINE = ("payment", "state")

    @classmethod
    def create(cls, payment_id: UUID, *, amount: Decimal, currency: str, account: str) -> PaymentTransaction:
        check_amount(amount, check_currency(currency))
        if not account.strip():
            raise InvalidValue("account", account, "must not be blank")
        payment = cls.blank(payment_id)
        payment._emit(PaymentCreated, amount=amount, currency=currency, account=account)
        return payment

    def submit(self) -> None:
        self._move(PaymentState.PENDING, PaymentSubmitted, attempt=self.attempts + 1)

    def complete(self) -> None:
        self._move(PaymentState.COMPLETED, PaymentCompleted)

    def fail(self, reason: str) -> None:
        self._move(PaymentState.FAILED, PaymentFailed, reason=reason)

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
