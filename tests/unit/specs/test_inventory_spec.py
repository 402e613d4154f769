"""InventoryItem (seed 001): stock received, reserved per reservation id, released or
fulfilled; available stock never goes negative. Each reservation is its own machine:
RESERVED -> RELEASED | FULFILLED."""

from __future__ import annotations

import pytest

from commitline.domain.errors import IllegalTransition, InvalidValue
from commitline.examples.inventory import DuplicateReservation, InsufficientStock, UnknownReservation
from commitline.examples.inventory import (
    InventoryItem,
    ReservationFulfilled,
    ReservationReleased,
    ReservationState,
    StockReceived,
    StockReserved,
)
from commitline.testing import event, given

RECEIVED_3 = event(StockReceived, quantity=3)
A_RESERVES_2 = event(StockReserved, reservation_id="a", quantity=2)
A_RELEASED = event(ReservationReleased, reservation_id="a", quantity=2)
A_FULFILLED = event(ReservationFulfilled, reservation_id="a", quantity=2)


def levels(item: InventoryItem) -> tuple[int, int, int]:
    return item.on_hand, item.reserved, item.available


def test_receive_new_records_the_first_stock() -> None:
    item = given(InventoryItem).when(lambda blank: InventoryItem.receive_new(blank.id, 3)).then(RECEIVED_3)
    assert levels(item) == (3, 0, 3) and item.fsm_states() == {}


def test_more_stock_adds_up() -> None:
    item = given(InventoryItem, RECEIVED_3).when(lambda i: i.receive(4)).then(event(StockReceived, quantity=4))
    assert levels(item) == (7, 0, 7)


@pytest.mark.parametrize("quantity", [0, -1])
def test_received_and_reserved_quantities_must_be_positive(quantity: int) -> None:
    given(InventoryItem).when(lambda i: InventoryItem.receive_new(i.id, quantity)).then_raises(
        InvalidValue, field="quantity", value=quantity
    )
    given(InventoryItem, RECEIVED_3).when(lambda i: i.reserve("c", quantity)).then_raises(
        InvalidValue, field="quantity", value=quantity
    )


def test_reserve_holds_stock_without_taking_it_off_hand() -> None:
    item = given(InventoryItem, RECEIVED_3).when(lambda i: i.reserve("a", 2)).then(A_RESERVES_2)
    assert levels(item) == (3, 2, 1)
    assert item.fsm_states() == {"reservation a": "RESERVED"}


def test_reservations_never_overdraw_stock() -> None:
    spec = given(InventoryItem, RECEIVED_3, A_RESERVES_2)
    error = spec.when(lambda i: i.reserve("b", 2)).then_raises(
        InsufficientStock, item_id=str(spec.id), requested=2, available=1
    )
    assert str(error) == f"item {spec.id}: requested 2, available 1"


def test_a_released_reservation_frees_its_stock() -> None:
    item = given(InventoryItem, RECEIVED_3, A_RESERVES_2).when(lambda i: i.release("a")).then(A_RELEASED)
    assert levels(item) == (3, 0, 3) and item.fsm_states() == {"reservation a": "RELEASED"}
    item = given(InventoryItem, RECEIVED_3, A_RESERVES_2, A_RELEASED).when(lambda i: i.reserve("b", 3)).then(
        event(StockReserved, reservation_id="b", quantity=3)
    )
    assert levels(item) == (3, 3, 0)


def test_fulfilment_takes_the_reserved_stock_off_hand() -> None:
    item = given(InventoryItem, event(StockReceived, quantity=5), A_RESERVES_2).when(lambda i: i.fulfil("a")).then(
        A_FULFILLED
    )
    assert levels(item) == (3, 0, 3) and item.reservations["a"].state is ReservationState.FULFILLED


@pytest.mark.parametrize("history", [(A_RESERVES_2,), (A_RESERVES_2, A_RELEASED)], ids=["reserved", "released"])
def test_a_reservation_id_is_used_once_even_after_release(history) -> None:
    spec = given(InventoryItem, RECEIVED_3, *history)
    spec.when(lambda i: i.reserve("a", 1)).then_raises(DuplicateReservation, item_id=str(spec.id), reservation_id="a")


@pytest.mark.parametrize("command", ["release", "fulfil"])
def test_unknown_reservations_are_refused(command: str) -> None:
    spec = given(InventoryItem, RECEIVED_3, A_RESERVES_2)
    spec.when(lambda i: getattr(i, command)("nope")).then_raises(
        UnknownReservation, item_id=str(spec.id), reservation_id="nope"
    )


@pytest.mark.parametrize(
    ("done", "command", "requested"),
    [(A_RELEASED, "release", "RELEASED"), (A_RELEASED, "fulfil", "FULFILLED"),
     (A_FULFILLED, "release", "RELEASED"), (A_FULFILLED, "fulfil", "FULFILLED")],
)
def test_a_released_or_fulfilled_reservation_is_final(done, command: str, requested: str) -> None:
    current = "RELEASED" if done is A_RELEASED else "FULFILLED"
    given(InventoryItem, RECEIVED_3, A_RESERVES_2, done).when(lambda i: getattr(i, command)("a")).then_raises(
        IllegalTransition, aggregate="Reservation", current=current, requested=requested, allowed=()
    )


def test_every_reservation_is_its_own_machine() -> None:
    item = given(InventoryItem, event(StockReceived, quantity=10), A_RESERVES_2, A_FULFILLED).when(
        lambda i: i.reserve("b", 1)
    ).then(event(StockReserved, reservation_id="b", quantity=1))
    assert item.fsm_states() == {"reservation a": "FULFILLED", "reservation b": "RESERVED"}
