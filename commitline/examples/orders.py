"""Orders (seed 001's third lesson): PLACED -> CONFIRMED | CANCELLED, and CONFIRMED ->
CANCELLED as a compensation. How an order is fulfilled is the saga's business
(``commitline.examples.fulfilment``); an order only records the outcome.

A customer may cancel a PLACED order (the saga then undoes whatever it had done); a CONFIRMED order's
payment is captured or being captured, so a customer's cancel is refused (``OrderAlreadyConfirmed``) and
only the saga's compensation, after its capture failed, cancels a confirmed order. So no cancelled order
ever keeps a captured payment.

The slice: the aggregate with its events, table and error, the customer's commands and their handlers."""

from __future__ import annotations

from decimal import Decimal
from enum import Enum
from typing import Annotated
from uuid import UUID

from commitline import (Aggregate, Domain, DomainError, Event, Id, InvalidValue, NonBlankText, Personal, Quantity,
                        Stream, Text, VersionedCommand, table)
from commitline.examples.money import PricedCommand, check_amount, check_currency
from commitline.examples.reads import payment_id_for

domain = Domain("orders")


class OrderPlaced(Event):
    item_id: UUID
    quantity: int
    amount: Decimal
    currency: str
    account: Annotated[str, Personal(subject="holder")]  # the order's ``holder``: its payment's, erased together


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


@domain.error
class OrderAlreadyConfirmed(DomainError):
    """A customer's cancel of a confirmed order: its payment is captured (or being captured), so cancelling
    it would leave the money taken. Only the fulfilment saga cancels a confirmed order, when its capture failed."""

    code = "order_already_confirmed"
    status = 409
    fields = ("order_id",)
    message = ("order {order_id} is confirmed and its payment captured or being captured: it can no longer be "
               "cancelled (a refund is a new business transaction, not a cancel)")


@domain.aggregate
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

    @property
    def holder(self) -> str:
        """The data subject of the account: the same as the payment the order is paid by (each payment is its
        own holder, ``payments.PaymentTransaction.holder``), so erasing that subject erases the account from both
        streams (and the fulfilment saga copies it from the order into the payment)."""
        return str(payment_id_for(self.id))

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


class PlaceOrder(PricedCommand):
    order_id: Id | None = None
    item_id: Id
    quantity: Quantity
    account: NonBlankText  # as a payment's: the saga charges it


class CancelOrder(VersionedCommand):
    order_id: Id
    reason: Text


class ConfirmOrder(VersionedCommand):
    order_id: Id


@domain.handles(PlaceOrder, Order, Stream.NEW, id="order_id")
def place_order(order: Order, cmd: PlaceOrder) -> Order:
    return Order.place(order.id, item_id=cmd.item_id, quantity=cmd.quantity, amount=cmd.amount,
                       currency=cmd.currency, account=cmd.account)


domain.handles(CancelOrder, Order, id="order_id")(lambda order, cmd: order.cancel(cmd.reason))
# Only the fulfilment saga confirms an order, once its payment is authorized: never a client over HTTP or the CLI
domain.handles(ConfirmOrder, Order, id="order_id", internal=True)(lambda order, cmd: order.confirm())
