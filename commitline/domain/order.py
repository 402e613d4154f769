"""Orders (seed 001's third lesson): PLACED -> CONFIRMED | CANCELLED, and CONFIRMED ->
CANCELLED as a compensation. How an order is fulfilled is the saga's business
(``commitline.domain.fulfilment``); an order only records the outcome.

A customer may cancel a PLACED order (the saga then undoes whatever it had done); a CONFIRMED order's
payment is captured or being captured, so a customer's cancel is refused (``OrderAlreadyConfirmed``) and
only the saga's compensation, after its capture failed, cancels a confirmed order. So no cancelled order
ever keeps a captured payment."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from uuid import UUID

from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.errors import InvalidValue, OrderAlreadyConfirmed
from commitline.domain.fsm import table
from commitline.domain.money import check_amount, check_currency


class OrderPlaced(Event):
    item_id: UUID
    quantity: int
    amount: Decimal
    currency: str
    account: str


class OrderConfirmed(Event):
    """Stock reserved and payment taken: the order stands (it may still be cancelled as a compensation)."""


class OrderCancelled(Event):
    reason: str


class OrderState(str, Enum):
    PLACED = "PLACED"
    CONFIRMED = "CONFIRMED"
    CANCELLED = "CANCELLED"


ORDER_TRANSITIONS = table("Order", {
    OrderState.PLACED: {OrderState.CONFIRMED, OrderState.CANCELLED},
    OrderState.CONFIRMED: {OrderState.CANCELLED},
    OrderState.CANCELLED: set(),
})


@dataclass(kw_only=True)
class Order(Aggregate):
    state: OrderState | None = None
    item_id: UUID | None = None
    quantity: int = 0
    amount: Decimal = Decimal(0)
    currency: str = ""
    account: str = ""
    cancel_reason: str | None = None

    EVENTS = (OrderPlaced, OrderConfirmed, OrderCancelled)
    TRANSITIONS = ORDER_TRANSITIONS
    MACHINE = ("order", "state")

    @classmethod
    def place(cls, order_id: UUID, *, item_id: UUID, quantity: int, amount: Decimal, currency: str,
              account: str) -> Order:
        if quantity <= 0:
            raise InvalidValue("quantity", quantity, "must be greater than zero")
        check_amount(amount, check_currency(currency))
        order = cls.blank(order_id)
        order._emit(OrderPlaced, item_id=item_id, quantity=quantity, amount=amount, currency=currency, account=account)
        return order

    def cancel(self, reason: str, *, compensation: bool = False) -> None:
        """A customer's cancel (refused once confirmed), or with ``compensation`` the saga's, after a failed capture."""
        if self.state is OrderState.CONFIRMED and not compensation:
            raise OrderAlreadyConfirmed(self.id)
        self._move(OrderState.CANCELLED, OrderCancelled, reason=reason)

    def confirm(self) -> None:
        self._move(OrderState.CONFIRMED, OrderConfirmed)

    def _evolve(self, event: Event) -> None:
        match event:
            case OrderPlaced(item_id=item_id, quantity=quantity, amount=amount, currency=currency, account=account):
                self.state, self.item_id, self.quantity = OrderState.PLACED, item_id, quantity
                self.amount, self.currency, self.account = amount, currency, account
            case OrderConfirmed():
                self.state = OrderState.CONFIRMED
            case OrderCancelled(reason=reason):
                self.state, self.cancel_reason = OrderState.CANCELLED, reason
