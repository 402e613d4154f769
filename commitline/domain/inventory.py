"""The inventory item aggregate (seed 001): stock received, reserved per reservation id,
released or fulfilled. Available stock never goes negative."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from uuid import UUID

from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.errors import DuplicateReservation, InsufficientStock, InvalidValue, UnknownReservation
from commitline.domain.fsm import table


class ReservationState(str, Enum):
    RESERVED = "RESERVED"
    RELEASED = "RELEASED"
    FULFILLED = "FULFILLED"


R = ReservationState
RESERVATION_TRANSITIONS = table("Reservation", {R.RESERVED: {R.RELEASED, R.FULFILLED}, R.RELEASED: set(), R.FULFILLED: set()})


class StockReceived(Event):
    quantity: int


class StockReserved(Event):
    reservation_id: str
    quantity: int


class ReservationReleased(Event):
    reservation_id: str
    quantity: int


class ReservationFulfilled(Event):
    reservation_id: str
    quantity: int


@dataclass
class Reservation:
    quantity: int
    state: ReservationState


def _positive(name: str, quantity: int) -> int:
    if quantity <= 0:
        raise InvalidValue(name, quantity, "must be greater than zero")
    return quantity


@dataclass(kw_only=True)
class InventoryItem(Aggregate):
    on_hand: int = 0
    reserved: int = 0
    reservations: dict[str, Reservation] = field(default_factory=dict)

    EVENTS = (StockReceived, StockReserved, ReservationReleased, ReservationFulfilled)
    TRANSITIONS = RESERVATION_TRANSITIONS
    MACHINE = ("reservation", "reservations")  # one machine per reservation

    @property
    def available(self) -> int:
        return self.on_hand - self.reserved

    @classmethod
    def receive_new(cls, item_id: UUID, quantity: int) -> InventoryItem:
        item = cls.blank(item_id)
        item.receive(quantity)
        return item

    def receive(self, quantity: int) -> None:
        self._emit(StockReceived, quantity=_positive("quantity", quantity))

    def reserve(self, reservation_id: str, quantity: int) -> None:
        _positive("quantity", quantity)
        if reservation_id in self.reservations:
            raise DuplicateReservation(str(self.id), reservation_id)
        if quantity > self.available:
            raise InsufficientStock(str(self.id), quantity, self.available)
        self._emit(StockReserved, reservation_id=reservation_id, quantity=quantity)

    def release(self, reservation_id: str) -> None:
        reservation = self._reservation_moving_to(reservation_id, R.RELEASED)
        self._emit(ReservationReleased, reservation_id=reservation_id, quantity=reservation.quantity)

    def fulfil(self, reservation_id: str) -> None:
        reservation = self._reservation_moving_to(reservation_id, R.FULFILLED)
        self._emit(ReservationFulfilled, reservation_id=reservation_id, quantity=reservation.quantity)

    def _reservation_moving_to(self, reservation_id: str, target: ReservationState) -> Reservation:
        reservation = self.reservations.get(reservation_id)
        if reservation is None:
            raise UnknownReservation(str(self.id), reservation_id)
        self._transition(target, reservation_id)
        return reservation

    def _evolve(self, event: Event) -> None:
        match event:
            case StockReceived(quantity=quantity):
                self.on_hand += quantity
            case StockReserved(reservation_id=rid, quantity=quantity):
                self.reservations[rid] = Reservation(quantity, R.RESERVED)
                self.reserved += quantity
            case ReservationReleased(reservation_id=rid, quantity=quantity):
                self.reservations[rid].state = R.RELEASED
                self.reserved -= quantity
            case ReservationFulfilled(reservation_id=rid, quantity=quantity):
                self.reservations[rid].state = R.FULFILLED
                self.reserved -= quantity
                self.on_hand -= quantity
