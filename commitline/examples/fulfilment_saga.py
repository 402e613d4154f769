"""The order-fulfilment process manager: reserve stock -> authorize the payment -> confirm the
order and capture; on a failure, undo what was done in reverse and cancel the order.

``advance(order_id, tenant)`` moves one order's saga as far as it can go and is safe to call again at
any moment, including after a crash half-way through: every action is a command or gateway call with an
idempotency key derived from the order, so a repeat replays the first outcome (a payment is never
charged twice), and every outcome is recorded as a saga event before the next step starts. A
compensation that keeps failing marks the saga STUCK and raises a critical alert; nothing is dropped.
The payment gateway is the domain's ``payments`` port (``gateways.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from uuid import UUID

from commitline import (AggregateNotFound, DomainError, Erased, IllegalTransition, InstanceRow, ProcessManager,
                        StuckInstance, WrongAggregateType, withheld)
from commitline.examples.fulfilment import (CancelOrderAfterFailure, FulfilmentRetried, MarkFulfilmentStuck,
                                            OrderFulfilment, ParkFulfilment, RecordCompensation,
                                            RecordFulfilmentCancelled, RecordFulfilmentFailure, RecordFulfilmentStep,
                                            RetryFulfilment, SagaState, StartFulfilment, domain, fulfilment_id,
                                            payment_id_for)
from commitline.examples.inventory import ReleaseReservation, ReserveStock, UnknownReservation
from commitline.examples.orders import ConfirmOrder, Order, OrderPlaced, OrderState
from commitline.examples.payment_gateway import (GatewayDeclined, GatewayMisconfigured, GatewayUnavailable,
                                                 PaymentGateway)
from commitline.examples.payments import (CompletePayment, CreatePayment, FailPayment, PaymentState, PaymentTransaction,
                                          SubmitPayment)
from commitline.examples.reads import ExampleReads, FulfilmentRow

log = logging.getLogger(__name__)
Do = Callable[[Any, str], None]
DONE = (SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.STUCK, SagaState.PARKED)


def told(error: BaseException, order: Order) -> str:
    """An error's message as a reason the saga stores in plain text (its events, the read model, Kafka): with the
    order's account withheld, as a gateway's refusal may quote it ("card declined for account FR76...")."""
    return withheld(str(error), {"account": order.account})


@domain.process_manager
class FulfilmentSaga(ProcessManager):
    name = "order-fulfilment"
    triggers = (OrderPlaced, FulfilmentRetried)
    read_models = ("order_fulfilments",)

    @property
    def gateway(self) -> PaymentGateway:
        return self.ports["payments"]  # type: ignore[no-any-return]

    def instance_of(self, event: Any, tenant: str) -> UUID:
        if isinstance(event, OrderPlaced):
            return event.aggregate_id
        # A retry recorded before its event named the order: the saga's own stream knows it.
        return event.order_id or self.order_of(event.aggregate_id, tenant)

    def advance(self, order_id: UUID, tenant: str = "default") -> SagaState:  # type: ignore[override]
        """Move the saga of ``order_id`` (an order of ``tenant``) as far as it goes; AggregateNotFound if
        the tenant has no such order."""
        def do(command: Any, action: str) -> None:
            self.dispatch(command, f"fulfilment/{order_id}/{action}", tenant)

        saga = self.load(OrderFulfilment, fulfilment_id(order_id), tenant)
        if not saga.exists:
            do(StartFulfilment(order_id=order_id), "start")
        while True:
            saga = self.load(OrderFulfilment, fulfilment_id(order_id), tenant)
            order = self.load(Order, order_id, tenant)
            if saga.state in DONE:
                assert saga.state is not None
                return saga.state
            if saga.state is SagaState.COMPENSATING:
                self._compensate(saga, order, do, tenant)
            elif saga.next_step == "reserve":
                self._reserve(order, do)
            elif saga.next_step == "charge":
                self._charge(order, do, tenant)
            else:
                self._confirm(order, do, tenant)

    # -- steps --------------------------------------------------------------------

    def _reserve(self, order: Order, do: Do) -> None:
        if order.state is OrderState.CANCELLED:  # cancelled before its fulfilment began: reserve and charge nothing
            return do(RecordFulfilmentFailure(order_id=order.id, step="reserve",
                                              reason="the order was cancelled before its fulfilment began"),
                      "reserve-failed")
        try:
            do(ReserveStock(item_id=order.item_id, reservation_id=str(order.id), quantity=order.quantity), "reserve")
        # no such item for this tenant, or another aggregate's id: refused; a conflict or outage is not a refusal
        # (advanced again later)
        except (DomainError, AggregateNotFound, WrongAggregateType) as e:
            return do(RecordFulfilmentFailure(order_id=order.id, step="reserve", reason=told(e, order)),
                      "reserve-failed")
        self.on_boundary("reserve:reserved")
        do(RecordFulfilmentStep(order_id=order.id, step="reserve", detail=f"{order.quantity} reserved"), "reserved")

    def _charge(self, order: Order, do: Do, tenant: str) -> None:
        if isinstance(order.account, Erased):  # its holder was erased before the charge: nobody left to charge
            return do(RecordFulfilmentFailure(order_id=order.id, step="charge",
                                              reason="the account was erased before the order was charged"),
                      "charge-failed")
        payment_id = payment_id_for(order.id)
        do(CreatePayment(payment_id=payment_id, amount=order.amount, currency=order.currency,
                         account=order.account), "payment")
        do(SubmitPayment(payment_id=payment_id), "payment-submit")
        self.on_boundary("charge:submitted")
        try:
            reference = self.retrying(lambda: self.gateway.authorize(
                self.gateway_key(order.id), order.amount, order.currency, order.account), GatewayUnavailable)
        except GatewayDeclined as e:
            do(FailPayment(payment_id=payment_id, reason=f"declined: {told(e, order)}"), "payment-fail")
            return do(RecordFulfilmentFailure(order_id=order.id, step="charge", reason=f"declined: {told(e, order)}"),
                      "charge-failed")
        except GatewayUnavailable as e:  # the outcome may be unknown: the compensation voids under the same key
            return do(RecordFulfilmentFailure(order_id=order.id, step="charge",
                                              reason=f"gateway unavailable after {self.attempts} attempts: "
                                                     f"{told(e, order)}"),
                      "charge-failed")
        except GatewayMisconfigured as e:  # our configuration, not the order: nothing to undo, wait for the fix
            return self.park(order.id, told(e, order), 1, tenant)
        self.on_boundary("charge:authorized")
        do(RecordFulfilmentStep(order_id=order.id, step="charge", detail=reference), "charged")

    def _confirm(self, order: Order, do: Do, tenant: str) -> None:
        try:
            do(ConfirmOrder(order_id=order.id), "confirm")
        except IllegalTransition as e:
            return do(RecordFulfilmentFailure(order_id=order.id, step="confirm", reason=told(e, order)),
                      "confirm-failed")
        self.on_boundary("confirm:confirmed")
        try:
            reference = self.retrying(lambda: self.gateway.capture(self.gateway_key(order.id)), GatewayUnavailable)
        except GatewayDeclined as e:  # a definite refusal: nothing was captured, so the order is undone
            return do(RecordFulfilmentFailure(order_id=order.id, step="confirm",
                                              reason=f"capture failed: {told(e, order)}"),
                      "confirm-failed")
        except (GatewayUnavailable, GatewayMisconfigured) as e:
            # No definite answer: the money may have been captured (an answer lost, a gateway that captured and
            # then failed), so nothing is undone; the saga waits, and `sagas retry` captures again under the same
            # key, which the gateway answers with its first outcome.
            return self.park(order.id, f"no definite answer to the capture after {self.attempts} attempts: "
                             f"{told(e, order)}", self.attempts, tenant)
        self.on_boundary("confirm:captured")
        do(CompletePayment(payment_id=payment_id_for(order.id)), "payment-complete")
        do(RecordFulfilmentStep(order_id=order.id, step="confirm", detail=reference), "confirmed")

    # -- compensation -------------------------------------------------------------

    def _compensate(self, saga: OrderFulfilment, order: Order, do: Do, tenant: str) -> None:
        for step in saga.to_compensate:
            undo = {"reserve": self._release, "charge": self._void,
                    "confirm": lambda o, t: "order to be cancelled"}[step]
            try:
                detail = self.retrying(lambda: undo(order, tenant))
            except Exception as e:
                reason = f"{type(e).__name__}: {told(e, order)}"
                log.critical("fulfilment of order %s is STUCK undoing %s after %d attempts: %s; manual "
                             "intervention needed", order.id, step, self.attempts, reason)
                return do(MarkFulfilmentStuck(order_id=order.id, step=step, reason=reason, attempts=self.attempts),
                          f"stuck-{step}-at-{saga.version}")
            self.on_boundary(f"compensate:{step}")
            do(RecordCompensation(order_id=order.id, step=step, detail=detail), f"undone-{step}")
        if self.load(Order, order.id, tenant).state is not OrderState.CANCELLED:
            try:
                do(CancelOrderAfterFailure(order_id=order.id, reason=saga.failure or "fulfilment failed"), "cancel")
            except IllegalTransition:
                pass  # cancelled meanwhile by the customer
        do(RecordFulfilmentCancelled(order_id=order.id, reason=saga.failure or "fulfilment failed"), "cancelled")

    def _release(self, order: Order, tenant: str) -> str:
        try:
            self.dispatch(ReleaseReservation(item_id=order.item_id, reservation_id=str(order.id)),
                          f"fulfilment/{order.id}/release", tenant)
        except (UnknownReservation, IllegalTransition, AggregateNotFound, WrongAggregateType):  # no such item
            return "nothing reserved"
        return f"{order.quantity} released"

    def _void(self, order: Order, tenant: str) -> str:
        self.gateway.void(self.gateway_key(order.id))
        payment = self.load(PaymentTransaction, payment_id_for(order.id), tenant)
        if payment.state is PaymentState.PENDING:
            self.dispatch(FailPayment(payment_id=payment.id, reason="order cancelled: authorization voided"),
                          f"fulfilment/{order.id}/payment-void", tenant)
        return "authorization voided"

    # -- parked and stuck sagas ---------------------------------------------------

    def park(self, order_id: UUID, reason: str, attempts: int, tenant: str = "default") -> None:
        """Record that advancing ``order_id``'s saga kept failing: it waits for ``commitline sagas retry``."""
        saga = self.load(OrderFulfilment, fulfilment_id(order_id), tenant)
        log.critical("fulfilment of order %s is PARKED after %d failed attempts: %s; fix the cause, then run "
                     "commitline sagas retry %s", order_id, attempts, reason, order_id)
        self.dispatch(ParkFulfilment(order_id=order_id, reason=reason[:2000], attempts=attempts),
                      f"fulfilment/{order_id}/park-at-{saga.version}", tenant)

    def retry(self, order_id: UUID, tenant: str, key: str) -> str:
        result = self.dispatch(RetryFulfilment(order_id=order_id), key, tenant)
        resumed = result.events[-1].payload.get("resumed", "COMPENSATING")
        return f"fulfilment of {order_id} resumed at {resumed} (version {result.version})"

    def stuck(self, reads: ExampleReads, tenant: str | None = None) -> list[StuckInstance]:
        return [StuckInstance(self.name, r.order_id, r.tenant, r.state, r.stuck, subject=f"order {r.order_id}",
                              problem=f"fulfilment {r.state}: {r.stuck}")
                for r in reads.fulfilments(stuck_only=True, tenant=tenant)]

    def instances(self, reads: ExampleReads, *, stuck_only: bool = False,  # type: ignore[override]
                  tenant: str | None = None) -> list[FulfilmentRow]:
        return reads.fulfilments(stuck_only=stuck_only, tenant=tenant)

    def describe(self, row: FulfilmentRow | InstanceRow) -> str:
        assert isinstance(row, FulfilmentRow)
        return f"{row.order_id}  tenant {row.tenant}  {row.state:<12} {row.stuck or row.failure}"

    def history_of(self, order_id: UUID) -> UUID:
        return fulfilment_id(order_id)

    # -- helpers ------------------------------------------------------------------

    def order_of(self, saga_id: UUID, tenant: str = "default") -> UUID:
        """The order a fulfilment saga (by its own id) belongs to."""
        order_id = self.load(OrderFulfilment, saga_id, tenant).order_id
        if order_id is None:
            raise AggregateNotFound(OrderFulfilment.__name__, saga_id)
        return order_id

    @staticmethod
    def gateway_key(order_id: UUID) -> str:
        return f"order/{order_id}"
