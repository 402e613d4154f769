"""Payments (seed 002): CREATED -> PENDING -> COMPLETED | FAILED, FAILED -> PENDING (a retry).

The whole slice: the transition table, the events, the aggregate, its commands and their handlers, and
the ``payment_states`` read model (payments per tenant, state and currency, with their sums).

The account is personal data: sealed in the store under the key of its holder, the data subject, which
``commitline erase --tenant T --subject S`` forgets. Until payments name their holder, each payment is its own
holder: ``S`` is the payment's id.
"""

from __future__ import annotations

from decimal import Decimal
from enum import Enum
from typing import Annotated
from uuid import UUID

from commitline import (Aggregate, Changes, Domain, Event, Id, InvalidValue, NonBlankText, Personal, Projection,
                        RecordedEvent, Stream, Table, Text, VersionedCommand, on, transitions)
from commitline.examples.money import PricedCommand, check_amount, check_currency
from commitline.examples.reads import ExampleReads, PaymentTotalsOut

domain = Domain("payments")


class PaymentState(str, Enum):
    CREATED = "CREATED"
    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


C, P, OK, KO = PaymentState.CREATED, PaymentState.PENDING, PaymentState.COMPLETED, PaymentState.FAILED
PAYMENT_TRANSITIONS = transitions({C: {P}, P: {OK, KO}, OK: set(), KO: {P}})


class PaymentCreated(Event):
    amount: Decimal
    currency: str
    account: Annotated[str, Personal(subject="holder")]  # the aggregate's ``holder``


class PaymentSubmitted(Event):
    """Moved to PENDING: first submission, or a retry after a failure."""

    attempt: int


class PaymentCompleted(Event):
    """The gateway captured the money: a terminal state."""


class PaymentFailed(Event):
    reason: str


@domain.aggregate
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

    @property
    def holder(self) -> str:
        """The data subject of the account: the payment's id, until payments name their account holder."""
        return str(self.id)

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


class CreatePayment(PricedCommand):
    payment_id: Id | None = None
    account: NonBlankText


class SubmitPayment(VersionedCommand):
    payment_id: Id


class CompletePayment(VersionedCommand):
    payment_id: Id


class FailPayment(VersionedCommand):
    payment_id: Id
    reason: Text


@domain.handles(CreatePayment, PaymentTransaction, Stream.NEW, id="payment_id")
def create_payment(p: PaymentTransaction, cmd: CreatePayment) -> PaymentTransaction:
    return PaymentTransaction.create(p.id, amount=cmd.amount, currency=cmd.currency, account=cmd.account)


domain.handles(SubmitPayment, PaymentTransaction, id="payment_id")(lambda p, cmd: p.submit())
domain.handles(CompletePayment, PaymentTransaction, id="payment_id")(lambda p, cmd: p.complete())
domain.handles(FailPayment, PaymentTransaction, id="payment_id")(lambda p, cmd: p.fail(cmd.reason))


# -- the read model: payments per (tenant, state, currency), and each payment's current state ------------

def _payment_key(r: RecordedEvent) -> tuple[object, ...] | None:
    if r.aggregate_type == "PaymentTransaction" and not isinstance(r.event, PaymentCreated):
        return (r.event.aggregate_id,)
    return None


@domain.read_model
class PaymentStates(Projection):
    """Payments per (tenant, state, currency) with their total amount, and each payment's current state."""

    name = "payment_states"
    copies_personal_data = False  # it receives PaymentCreated.account but stores none of it
    tables = (
        Table("rm_payments", {"payment_id": "uuid", "tenant": "text", "state": "text", "amount": "numeric",
                              "currency": "text"}, key=("payment_id",)),
        Table("rm_payment_totals", {"tenant": "text", "state": "text", "currency": "text", "payments": "bigint",
                                    "amount": "numeric"}, key=("tenant", "state", "currency"),
              counters=("payments", "amount")),
    )
    prefetch = {"rm_payments": _payment_key}

    @on(PaymentCreated)
    def created(self, changes: Changes, r: RecordedEvent) -> None:
        e = r.event
        changes.put("rm_payments", (e.aggregate_id,), tenant=r.tenant, state=PaymentState.CREATED.value,
                    amount=e.amount, currency=e.currency)
        changes.add("rm_payment_totals", (r.tenant, PaymentState.CREATED.value, e.currency), payments=1,
                    amount=e.amount)

    @on(PaymentSubmitted)
    def submitted(self, changes: Changes, r: RecordedEvent) -> None:
        self._move(changes, r, PaymentState.PENDING)

    @on(PaymentCompleted)
    def completed(self, changes: Changes, r: RecordedEvent) -> None:
        self._move(changes, r, PaymentState.COMPLETED)

    @on(PaymentFailed)
    def failed(self, changes: Changes, r: RecordedEvent) -> None:
        self._move(changes, r, PaymentState.FAILED)

    @staticmethod
    def _move(changes: Changes, r: RecordedEvent, target: PaymentState) -> None:
        payment = changes.get("rm_payments", (r.event.aggregate_id,))
        if payment is None:
            raise LookupError(f"payment {r.event.aggregate_id} changed state before it was created")
        tenant, currency, amount = payment["tenant"], payment["currency"], payment["amount"]
        changes.add("rm_payment_totals", (tenant, payment["state"], currency), payments=-1, amount=-amount)
        changes.add("rm_payment_totals", (tenant, target.value, currency), payments=1, amount=amount)
        changes.put("rm_payments", (r.event.aggregate_id,), state=target.value)


@domain.query("payment-totals", response=PaymentTotalsOut,
              summary="The caller's payments and their sums per state and currency")
def payment_totals(reads: ExampleReads, tenant: str) -> dict[str, object]:
    return {"tenant": tenant, "totals": [
        {"state": t.state, "currency": t.currency, "payments": t.payments, "amount": str(t.amount)}
        for t in reads.payment_totals(tenant=tenant)]}
