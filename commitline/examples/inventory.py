"""Inventory (seed 001): stock received, reserved per reservation id, released or fulfilled. Available
stock never goes negative; each reservation is a machine of its own: RESERVED -> RELEASED | FULFILLED.

The whole slice: the aggregate with its events and table, its errors, commands and handlers, and the
``inventory_levels`` read model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from uuid import UUID

from commitline import (Aggregate, AggregateNotFound, Changes, Domain, DomainError, Event, Id, InvalidValue, Projection,
                        Quantity, RecordedEvent, Stream, Table, Text, VersionedCommand, on, table)
from commitline.examples.reads import ExampleReads, InventoryLevelOut

domain = Domain("inventory")


class ReservationState(str, Enum):
    RESERVED = "RESERVED"
    RELEASED = "RELEASED"
    FULFILLED = "FULFILLED"


R = ReservationState
RESERVATION_TRANSITIONS = table("Reservation", {R.RESERVED: {R.RELEASED, R.FULFILLED}, R.RELEASED: set(),
                                                R.FULFILLED: set()})


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


@domain.error
class InsufficientStock(DomainError):
    """A reservation asked for more than the item has available."""

    code = "insufficient_stock"
    status = 409
    fields = ("item_id", "requested", "available")
    message = "item {item_id}: requested {requested}, available {available}"


class ReservationError(DomainError):
    """A command named a reservation the item does not have, or already has."""

    fields = ("item_id", "reservation_id")


@domain.error
class UnknownReservation(ReservationError):
    """The item has no reservation of that id."""

    code = "unknown_reservation"
    status = 404
    message = "item {item_id} has no reservation {reservation_id}"


@domain.error
class DuplicateReservation(ReservationError):
    """The item already has a reservation of that id."""

    code = "duplicate_reservation"
    status = 409
    message = "item {item_id} already has a reservation {reservation_id}"


@dataclass
class Reservation:
    quantity: int
    state: ReservationState


def _positive(name: str, quantity: int) -> int:
    if quantity <= 0:
        raise InvalidValue(name, quantity, "must be greater than zero")
    return quantity


@domain.aggregate
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


class ReceiveStock(VersionedCommand):
    item_id: Id
    quantity: Quantity


class ReserveStock(VersionedCommand):
    item_id: Id
    reservation_id: Text
    quantity: Quantity


class ReleaseReservation(VersionedCommand):
    item_id: Id
    reservation_id: Text


class FulfilReservation(VersionedCommand):
    item_id: Id
    reservation_id: Text


domain.handles(ReceiveStock, InventoryItem, Stream.ANY, id="item_id")(lambda item, cmd: item.receive(cmd.quantity))
domain.handles(ReserveStock, InventoryItem, id="item_id")(
    lambda item, cmd: item.reserve(cmd.reservation_id, cmd.quantity))
domain.handles(ReleaseReservation, InventoryItem, id="item_id")(lambda item, cmd: item.release(cmd.reservation_id))
domain.handles(FulfilReservation, InventoryItem, id="item_id")(lambda item, cmd: item.fulfil(cmd.reservation_id))


# -- the read model: on-hand and reserved units per item --------------------------------------------------

@domain.read_model
class InventoryLevels(Projection):
    """On-hand and reserved units per item; available = on hand - reserved."""

    name = "inventory_levels"
    tables = (
        Table("rm_inventory_levels", {"item_id": "uuid", "tenant": "text", "on_hand": "bigint", "reserved": "bigint"},
              key=("item_id",), counters=("on_hand", "reserved")),
    )

    def _add(self, changes: Changes, r: RecordedEvent, **deltas: int) -> None:
        changes.add("rm_inventory_levels", (r.event.aggregate_id,), **deltas)
        changes.put("rm_inventory_levels", (r.event.aggregate_id,), tenant=r.tenant)

    @on(StockReceived)
    def received(self, changes: Changes, r: RecordedEvent) -> None:
        self._add(changes, r, on_hand=r.event.quantity)

    @on(StockReserved)
    def reserved(self, changes: Changes, r: RecordedEvent) -> None:
        self._add(changes, r, reserved=r.event.quantity)

    @on(ReservationReleased)
    def released(self, changes: Changes, r: RecordedEvent) -> None:
        self._add(changes, r, reserved=-r.event.quantity)

    @on(ReservationFulfilled)
    def fulfilled(self, changes: Changes, r: RecordedEvent) -> None:
        self._add(changes, r, reserved=-r.event.quantity, on_hand=-r.event.quantity)


@domain.query("inventory-levels/{item_id}", response=InventoryLevelOut, summary="An inventory item's stock")
def inventory_level(reads: ExampleReads, tenant: str, item_id: UUID) -> dict[str, object]:
    level = reads.inventory_level(item_id, tenant=tenant)
    if level is None:
        raise AggregateNotFound("InventoryItem", item_id)
    return {"item_id": item_id, "on_hand": level.on_hand, "reserved": level.reserved, "available": level.available}
