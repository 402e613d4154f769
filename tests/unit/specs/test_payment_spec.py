"""PaymentTransaction (seed 002): CREATED -> PENDING -> COMPLETED | FAILED, FAILED -> PENDING (a retry)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from commitline.domain.errors import IllegalTransition, InvalidValue
from commitline.examples.orders import OrderCancelled
from commitline.examples.payments import (
    PaymentCompleted,
    PaymentCreated,
    PaymentFailed,
    PaymentState,
    PaymentSubmitted,
    PaymentTransaction,
)
from commitline.testing import event, given, recorded

CREATED = event(PaymentCreated, amount=Decimal("10.00"), currency="EUR", account="acc-1")
SUBMITTED = event(PaymentSubmitted, attempt=1)
FAILED = event(PaymentFailed, reason="declined")


def create(amount: str, currency: str = "EUR", account: str = "acc-1"):
    return lambda blank: PaymentTransaction.create(blank.id, amount=Decimal(amount), currency=currency, account=account)


def test_create_records_the_money_exactly() -> None:
    payment = given(PaymentTransaction).when(create("1234.50", "USD")).then(
        event(PaymentCreated, amount=Decimal("1234.50"), currency="USD", account="acc-1")
    )
    assert payment.state is PaymentState.CREATED and str(payment.amount) == "1234.50"
    assert payment.fsm_states() == {"payment": "CREATED"}


@pytest.mark.parametrize(
    ("amount", "currency", "field"),
    [
        ("0", "EUR", "amount"),
        ("-5", "EUR", "amount"),
        ("1.001", "EUR", "amount"),
        ("1.5", "JPY", "amount"),
        ("NaN", "EUR", "amount"),
        ("10", "EURO", "currency"),
        ("10", "ABC", "currency"),
    ],
)
def test_create_refuses_bad_money(amount: str, currency: str, field: str) -> None:
    given(PaymentTransaction).when(create(amount, currency)).then_raises(InvalidValue, field=field)


def test_create_refuses_a_blank_account() -> None:
    error = given(PaymentTransaction).when(create("10", account="  ")).then_raises(InvalidValue, field="account")
    assert error.details() == {"field": "account", "value": "  ", "reason": "must not be blank"}


def test_submit_moves_to_pending_as_attempt_one() -> None:
    payment = given(PaymentTransaction, CREATED).when(lambda p: p.submit()).then(SUBMITTED)
    assert payment.state is PaymentState.PENDING and payment.fsm_states() == {"payment": "PENDING"}


def test_complete_from_pending() -> None:
    payment = given(PaymentTransaction, CREATED, SUBMITTED).when(lambda p: p.complete()).then(event(PaymentCompleted))
    assert payment.state is PaymentState.COMPLETED


def test_fail_records_the_reason() -> None:
    payment = given(PaymentTransaction, CREATED, SUBMITTED).when(lambda p: p.fail("declined")).then(FAILED)
    assert (payment.state, payment.failure_reason) == (PaymentState.FAILED, "declined")


def test_a_retry_after_failure_is_the_next_attempt_and_clears_the_reason() -> None:
    payment = given(PaymentTransaction, CREATED, SUBMITTED, FAILED).when(lambda p: p.submit()).then(
        event(PaymentSubmitted, attempt=2)
    )
    assert (payment.state, payment.attempts, payment.failure_reason) == (PaymentState.PENDING, 2, None)


def test_failed_to_completed_is_refused_naming_the_allowed_target() -> None:
    error = given(PaymentTransaction, CREATED, SUBMITTED, FAILED).when(lambda p: p.complete()).then_raises(
        IllegalTransition, aggregate="PaymentTransaction", current="FAILED", requested="COMPLETED", allowed=("PENDING",)
    )
    assert str(error) == "PaymentTransaction cannot move from FAILED to COMPLETED; allowed from FAILED: PENDING"


def test_completed_is_terminal() -> None:
    error = given(PaymentTransaction, CREATED, SUBMITTED, event(PaymentCompleted)).when(
        lambda p: p.submit()
    ).then_raises(IllegalTransition, current="COMPLETED", requested="PENDING", allowed=())
    assert str(error).endswith("allowed from COMPLETED: none (terminal state)")


def test_created_cannot_skip_pending() -> None:
    given(PaymentTransaction, CREATED).when(lambda p: p.fail("x")).then_raises(
        IllegalTransition, current="CREATED", requested="FAILED", allowed=("PENDING",)
    )


def test_a_payment_never_created_cannot_move() -> None:
    given(PaymentTransaction).when(lambda p: p.submit()).then_raises(
        IllegalTransition, aggregate="PaymentTransaction", current="NEW", requested="PENDING", allowed=()
    )


def test_events_of_another_aggregate_are_refused_on_replay() -> None:
    payment = given(PaymentTransaction, CREATED).aggregate()
    with pytest.raises(TypeError, match="PaymentTransaction cannot apply OrderCancelled"):
        payment.apply(recorded(payment.id, (event(OrderCancelled, reason="x"),), after=1)[0])
    assert payment.version == 1
