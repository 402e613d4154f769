"""Order: PLACED -> CONFIRMED | CANCELLED, and CONFIRMED -> CANCELLED (the saga's compensation only: a
customer's cancel of a confirmed order is refused, its payment being captured)."""

from __future__ import annotations

from decimal import Decimal
from itertools import product
from uuid import uuid4

import pytest

from commitline.domain.errors import IllegalTransition, InvalidValue
from commitline.examples.orders import OrderAlreadyConfirmed
from commitline.examples.orders import ORDER_TRANSITIONS, Order, OrderCancelled, OrderConfirmed, OrderPlaced, OrderState
from commitline.testing import event, given

ITEM = uuid4()
PLACED = event(OrderPlaced, item_id=ITEM, quantity=2, amount=Decimal("25.00"), currency="EUR", account="acc-1")
CONFIRMED = event(OrderConfirmed)
CANCELLED = event(OrderCancelled, reason="out of stock")
HISTORY = {OrderState.PLACED: (PLACED,), OrderState.CONFIRMED: (PLACED, CONFIRMED),
           OrderState.CANCELLED: (PLACED, CANCELLED)}
COMMANDS = {OrderState.CONFIRMED: lambda o: o.confirm(),
            OrderState.CANCELLED: lambda o: o.cancel("out of stock", compensation=True)}
EVENTS = {OrderState.CONFIRMED: CONFIRMED, OrderState.CANCELLED: CANCELLED}
O = OrderState
ALLOWED = {(O.PLACED, O.CONFIRMED), (O.PLACED, O.CANCELLED), (O.CONFIRMED, O.CANCELLED)}


def place(quantity: int = 2, amount: str = "25.00", currency: str = "EUR"):
    return lambda blank: Order.place(blank.id, item_id=ITEM, quantity=quantity, amount=Decimal(amount),
                                     currency=currency, account="acc-1")


def test_place_records_what_was_ordered() -> None:
    order = given(Order).when(place()).then(PLACED)
    assert (order.state, order.item_id, order.quantity, order.amount) == (O.PLACED, ITEM, 2, Decimal("25.00"))
    assert order.fsm_states() == {"order": "PLACED"}


@pytest.mark.parametrize(
    ("quantity", "amount", "currency", "field"),
    [(0, "25.00", "EUR", "quantity"), (-1, "25.00", "EUR", "quantity"), (1, "0", "EUR", "amount"),
     (1, "2.555", "EUR", "amount"), (1, "25", "EURO", "currency")],
)
def test_place_refuses_bad_quantities_and_money(quantity: int, amount: str, currency: str, field: str) -> None:
    given(Order).when(place(quantity, amount, currency)).then_raises(InvalidValue, field=field)


def test_confirm_a_placed_order() -> None:
    order = given(Order, PLACED).when(lambda o: o.confirm()).then(CONFIRMED)
    assert order.state is O.CONFIRMED and order.cancel_reason is None


def test_cancel_a_placed_order_keeps_the_reason() -> None:
    order = given(Order, PLACED).when(lambda o: o.cancel("out of stock")).then(CANCELLED)
    assert (order.state, order.cancel_reason) == (O.CANCELLED, "out of stock")
    assert order.fsm_states() == {"order": "CANCELLED"}


def test_a_confirmed_order_can_still_be_cancelled_as_a_compensation() -> None:
    order = given(Order, PLACED, CONFIRMED).when(lambda o: o.cancel("capture failed", compensation=True)).then(
        event(OrderCancelled, reason="capture failed")
    )
    assert (order.state, order.cancel_reason) == (O.CANCELLED, "capture failed")


def test_a_customer_cannot_cancel_a_confirmed_order() -> None:
    error = given(Order, PLACED, CONFIRMED).when(lambda o: o.cancel("changed my mind")).then_raises(
        OrderAlreadyConfirmed)
    assert error.code == "order_already_confirmed" and "can no longer be cancelled" in str(error)


def test_the_table_is_exactly_the_documented_one() -> None:
    assert {(s, t) for s, t in product(O, O) if ORDER_TRANSITIONS.can(s, t)} == ALLOWED
    assert Order.TRANSITIONS is ORDER_TRANSITIONS


@pytest.mark.parametrize(("current", "target"), list(product(HISTORY, COMMANDS)))
def test_every_state_and_command(current: OrderState, target: OrderState) -> None:
    spec = given(Order, *HISTORY[current]).when(COMMANDS[target])
    if (current, target) in ALLOWED:
        assert spec.then(EVENTS[target]).state is target
    else:
        spec.then_raises(IllegalTransition, aggregate="Order", current=current.value, requested=target.value,
                         allowed=tuple(sorted(t.value for s, t in ALLOWED if s is current)))


def test_a_cancelled_order_is_final() -> None:
    error = given(Order, PLACED, CANCELLED).when(lambda o: o.confirm()).then_raises(IllegalTransition)
    assert str(error) == "Order cannot move from CANCELLED to CONFIRMED; allowed from CANCELLED: none (terminal state)"


@pytest.mark.parametrize("target", list(COMMANDS))
def test_an_order_never_placed_cannot_move(target: OrderState) -> None:
    given(Order).when(COMMANDS[target]).then_raises(IllegalTransition, current="NEW", requested=target.value, allowed=())
