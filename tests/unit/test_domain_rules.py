"""Domain invariants that are not transitions: money, stock, survey issue rules."""

from __future__ import annotations

from decimal import Decimal
from uuid import uuid4

import pytest

from commitline.domain.errors import (
    DuplicateReservation,
    InsufficientStock,
    InvalidValue,
    TaskClosed,
    UnknownReservation,
    UserNotIssued,
    UsersAlreadyIssued,
)
from commitline.domain.inventory import InventoryItem
from commitline.domain.payment import PaymentTransaction
from commitline.domain.survey import SurveyAssignment, SurveyTask, assignment_id


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
def test_payment_creation_rejects_bad_money(amount: str, currency: str, field: str) -> None:
    with pytest.raises(InvalidValue) as caught:
        PaymentTransaction.create(uuid4(), amount=Decimal(amount), currency=currency, account="acc")
    assert caught.value.field == field


def test_payment_keeps_amount_exactly() -> None:
    payment = PaymentTransaction.create(uuid4(), amount=Decimal("1234.50"), currency="USD", account="acc")
    assert payment.amount == Decimal("1234.50") and str(payment.amount) == "1234.50"


def test_reservations_never_overdraw_stock() -> None:
    item = InventoryItem.receive_new(uuid4(), 3)
    item.reserve("a", 2)
    with pytest.raises(InsufficientStock) as caught:
        item.reserve("b", 2)
    assert (caught.value.requested, caught.value.available) == (2, 1)
    assert str(item.id) in str(caught.value)
    item.release("a")
    item.reserve("b", 3)
    assert item.available == 0


def test_reservation_errors() -> None:
    item = InventoryItem.receive_new(uuid4(), 3)
    with pytest.raises(UnknownReservation):
        item.release("nope")
    item.reserve("a", 1)
    with pytest.raises(DuplicateReservation):
        item.reserve("a", 1)
    with pytest.raises(InvalidValue):
        item.reserve("c", 0)


def test_fulfilment_takes_stock_off_hand() -> None:
    item = InventoryItem.receive_new(uuid4(), 5)
    item.reserve("a", 2)
    item.fulfil("a")
    assert (item.on_hand, item.reserved, item.available) == (3, 0, 3)


def test_survey_task_issue_rules() -> None:
    task = SurveyTask.create(uuid4(), "Satisfaction")
    task.issue([f"u{i}" for i in range(10_000)])
    assert len(task.issued) == 10_000
    with pytest.raises(UsersAlreadyIssued) as caught:
        task.issue(["u5", "new"])
    assert caught.value.user_ids == ("u5",)
    with pytest.raises(InvalidValue):
        task.issue(["x", "x"])
    task.issue([f"v{i}" for i in range(5_000)])
    assert (len(task.issued), task.rounds) == (15_000, 2)
    task.close()
    with pytest.raises(TaskClosed):
        task.issue(["late"])


def test_only_issued_users_answer_and_not_after_close() -> None:
    task = SurveyTask.create(uuid4(), "T")
    task.issue(["u1", "u2"])
    with pytest.raises(UserNotIssued):
        SurveyAssignment.blank(assignment_id(task.id, "stranger")).answer(task, "stranger")
    task.close()
    with pytest.raises(TaskClosed):
        SurveyAssignment.blank(assignment_id(task.id, "u1")).answer(task, "u1")
