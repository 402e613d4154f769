"""Bad input and refused commands: a typed error naming what was wrong, and the store unchanged."""

from __future__ import annotations

from uuid import uuid4

import pytest

from commitline.application import errors as E
from commitline.composition import Commitline
from tests.integration.test_concurrency import new_payment
from tests.support import count_rows

PAYMENT = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-1"}


@pytest.mark.parametrize(
    ("command", "key", "error"),
    [
        ({**PAYMENT, "amount": "-12.50"}, "k", E.InvalidCommand),
        ({**PAYMENT, "amount": 12.5}, "k", E.InvalidCommand),
        ({**PAYMENT, "currency": "EUX"}, "k", E.InvalidCommand),
        ({**PAYMENT, "amount": ["12"]}, "k", E.InvalidCommand),
        ({**PAYMENT, "extra": True}, "k", E.InvalidCommand),
        ({"type": "teleport_money"}, "k", E.UnknownCommandType),
        ("not json at all", "k", E.InvalidCommand),
        (PAYMENT, None, E.MissingIdempotencyKey),
        (PAYMENT, "   ", E.MissingIdempotencyKey),
        (PAYMENT, "x" * 300, E.MissingIdempotencyKey),
        ({"type": "submit_payment", "payment_id": str(uuid4())}, "k", E.AggregateNotFound),
        ({"type": "reserve_stock", "item_id": str(uuid4()), "reservation_id": "r", "quantity": 1}, "k",
         E.AggregateNotFound),
        ({"type": "answer_survey_task", "task_id": str(uuid4()), "user_id": "u"}, "k", E.AggregateNotFound),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    app: Commitline, pg_dsn: str, schema: str, command: object, key: str | None, error: type[Exception]
) -> None:
    new_payment(app)
    before = count_rows(pg_dsn, schema)
    with pytest.raises(error) as caught:
        app.dispatch(command, idempotency_key=key)
    assert caught.value.to_dict()["code"] == caught.value.code
    assert count_rows(pg_dsn, schema) == before


def test_invalid_tenant(app: Commitline) -> None:
    with pytest.raises(E.InvalidTenant):
        app.dispatch(PAYMENT, idempotency_key="k", tenant="no spaces please")


def test_illegal_transition_writes_nothing(app: Commitline, pg_dsn: str, schema: str) -> None:
    payment_id = new_payment(app)
    app.dispatch({"type": "submit_payment", "payment_id": str(payment_id)}, idempotency_key="s")
    app.dispatch({"type": "fail_payment", "payment_id": str(payment_id), "reason": "declined"}, idempotency_key="f")
    before = count_rows(pg_dsn, schema)
    with pytest.raises(E.IllegalTransition) as caught:
        app.dispatch({"type": "complete_payment", "payment_id": str(payment_id)}, idempotency_key="c")
    assert caught.value.details() == {
        "aggregate": "PaymentTransaction", "current": "FAILED", "requested": "COMPLETED", "allowed": ["PENDING"]
    }
    assert count_rows(pg_dsn, schema) == before
    # The refusal was not recorded under the key: once the state allows it, the same key succeeds.
    app.dispatch({"type": "submit_payment", "payment_id": str(payment_id)}, idempotency_key="retry")
    assert app.dispatch({"type": "complete_payment", "payment_id": str(payment_id)}, idempotency_key="c").version == 5


def test_creating_an_existing_aggregate_and_using_the_wrong_type(app: Commitline) -> None:
    pid = uuid4()
    app.dispatch({**PAYMENT, "payment_id": str(pid)}, idempotency_key="a")
    with pytest.raises(E.AggregateAlreadyExists):
        app.dispatch({**PAYMENT, "payment_id": str(pid)}, idempotency_key="b")
    with pytest.raises(E.WrongAggregateType) as caught:
        app.dispatch({"type": "receive_stock", "item_id": str(pid), "quantity": 1}, idempotency_key="c")
    assert (caught.value.expected, caught.value.actual) == ("InventoryItem", "PaymentTransaction")
