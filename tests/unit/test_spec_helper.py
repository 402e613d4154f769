"""The given/when/then helper fails when the command does something other than specified."""

from __future__ import annotations

from decimal import Decimal

import pytest

from commitline.domain.errors import IllegalTransition
from commitline.examples.payments import PaymentCompleted, PaymentCreated, PaymentSubmitted, PaymentTransaction
from commitline.testing import event, given

CREATED = given(PaymentTransaction, event(PaymentCreated, amount=Decimal("10.00"), currency="EUR", account="a"))


def submit_and_complete(p: PaymentTransaction) -> None:
    p.submit()
    p.complete()


def touch_then_refuse(p: PaymentTransaction) -> None:
    p.attempts = 5
    p.complete()


@pytest.mark.parametrize(
    "spec",
    [
        lambda: CREATED.when(lambda p: p.submit()).then(event(PaymentSubmitted, attempt=2)),  # other payload
        lambda: CREATED.when(lambda p: p.submit()).then(event(PaymentCompleted)),  # other type
        lambda: CREATED.when(submit_and_complete).then(event(PaymentSubmitted, attempt=1)),  # an extra event
        lambda: CREATED.when(lambda p: p.complete()).then(event(PaymentCompleted)),  # refused instead
        lambda: CREATED.when(lambda p: p.submit()).then_raises(IllegalTransition),  # not refused
        lambda: CREATED.when(lambda p: p.complete()).then_raises(IllegalTransition, current="PENDING"),  # other field
        lambda: CREATED.when(touch_then_refuse).then_raises(IllegalTransition),  # refused, but changed state
    ],
)
def test_a_spec_that_does_not_hold_fails(spec) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        spec()


@pytest.mark.parametrize(("spec", "says"), [
    (lambda: CREATED.when(lambda p: p.submit()).then(event(PaymentSubmitted, attempt=2)),
     r"the command emitted \[PaymentSubmitted\(attempt=1\)\], expected \[PaymentSubmitted\(attempt=2\)\]"),
    (lambda: CREATED.when(lambda p: p.complete()).then_raises(IllegalTransition, current="PENDING"),
     r"IllegalTransition was raised with \{'current': 'CREATED'\}, expected \{'current': 'PENDING'\}"),
    (lambda: CREATED.when(touch_then_refuse).then_raises(IllegalTransition),
     r"a refused command must not change the aggregate: it left PaymentTransaction\(.*attempts=5"),
])
def test_a_failing_spec_says_what_happened_and_what_was_expected(spec, says: str) -> None:
    """The helper is library code, which pytest does not rewrite: its own messages are all a reader gets."""
    with pytest.raises(AssertionError, match=says):
        spec()


def test_given_events_are_replayed_in_order_with_versions() -> None:
    payment = CREATED.when(lambda p: p.submit()).then(event(PaymentSubmitted, attempt=1))
    assert (payment.id, payment.version) == (CREATED.id, 2)


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({"amount": 10.5, "currency": "EUR", "account": "a"}, "PaymentCreated.amount is a Decimal field"),
        ({"amount": Decimal("1"), "currency": "EUR", "account": "a", "nonsense": 1}, "declares no field 'nonsense'"),
        ({"amount": Decimal("1"), "currency": "EUR"}, "leaves out 'account'"),
    ],
)
def test_a_spec_cannot_state_an_event_no_store_could_hold(payload: dict, says: str) -> None:
    with pytest.raises(TypeError, match=says):
        event(PaymentCreated, **payload)
