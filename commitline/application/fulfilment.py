"""The order-fulfilment process manager: reserve stock -> authorize the payment -> confirm the
order and capture; on a failure, undo what was done in reverse and cancel the order.

``advance(order_id)`` moves one order's saga as far as it can go and is safe to call again at
any moment, including after a crash half-way through: every action is a command or gateway
call with an idempotency key derived from the order, so a repeat replays the first outcome
(a payment is never charged twice), and every outcome is recorded as a saga event before the
next step starts. A compensation that keeps failing marks the saga STUCK and raises a
critical alert; nothing is dropped.

Everything a saga does happens as the order's tenant (``advance`` is given the tenant recorded in the
order's events): each step and compensation is dispatched, and each aggregate read, under it, so a
saga never sees or touches another tenant's streams.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar
from uuid import UUID

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from commitline.application import commands as c
from commitline.application.errors import AggregateNotFound, DomainError, IllegalTransition, UnknownReservation
from commitline.application.payment_gateway import GatewayDeclined, GatewayUnavailable, PaymentGateway
from commitline.application.ports import EventStore, ForeignStream
from commitline.application.processor import CommandProcessor
from commitline.domain import Aggregate
from commitline.domain.fulfilment import OrderFulfilment, SagaState, fulfilment_id, payment_id_for
from commitline.domain.order import Order, OrderState
from commitline.domain.payment import PaymentState, PaymentTransaction

log = logging.getLogger(__name__)
Boundary = Callable[[str], None]
A = TypeVar("A", bound=Aggregate)


class FulfilmentSaga:
    def __init__(self, processor: CommandProcessor, store: EventStore, gateway: PaymentGateway, *,
                 attempts: int = 3, backoff: float = 0.05, on_boundary: Boundary | None = None):
        self.processor = processor
        self.store = store
        self.gateway = gateway
        self.attempts = attempts
        self.backoff = backoff
        self.on_boundary = on_boundary or (lambda _: None)

    def advance(self, order_id: UUID, tenant: str = "default") -> SagaState:
        """Move the saga of ``order_id`` (an order of ``tenant``) as far as it goes; AggregateNotFound if
        the tenant has no such order."""
        def do(command: c.Command, action: str) -> None:
            self.processor.dispatch(command, idempotency_key=f"fulfilment/{order_id}/{action}", tenant=tenant)

        saga = self._load(OrderFulfilment, fulfilment_id(order_id), tenant)
        if not saga.exists:
            do(c.StartFulfilment(order_id=order_id), "start")
        while True:
            saga = self._load(OrderFulfilment, fulfilment_id(order_id), tenant)
            order = self._load(Order, order_id, tenant)
            if saga.state in (SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.STUCK, SagaState.PARKED):
                return saga.state
            if saga.state is SagaState.COMPENSATING:
                self._compensate(saga, order, do, tenant)
            elif saga.next_step == "reserve":
                self._reserve(order, do)
            elif saga.next_step == "charge":
                self._charge(order, do)
            else:
                self._confirm(order, do)

    # -- steps --------------------------------------------------------------------

    def _reserve(self, order: Order, do: Callable[[c.Command, str], None]) -> None:
        try:
            do(c.ReserveStock(item_id=order.item_id, reservation_id=str(order.id), quantity=order.quantity), "reserve")
        except (DomainError, AggregateNotFound) as e:  # a conflict or outage is not a refusal: advance again later
            return do(c.RecordFulfilmentFailure(order_id=order.id, step="reserve", reason=str(e)), "reserve-failed")
        self.on_boundary("reserve:reserved")
        do(c.RecordFulfilmentStep(order_id=order.id, step="reserve", detail=f"{order.quantity} reserved"), "reserved")

    def _charge(self, order: Order, do: Callable[[c.Command, str], None]) -> None:
        payment_id = payment_id_for(order.id)
        do(c.CreatePayment(payment_id=payment_id, amount=order.amount, currency=order.currency,
                           account=order.account), "payment")
        do(c.SubmitPayment(payment_id=payment_id), "payment-submit")
        self.on_boundary("charge:submitted")
        try:
            reference = self._retrying(lambda: self.gateway.authorize(
                self.gateway_key(order.id), order.amount, order.currency, order.account))
        except GatewayDeclined as e:
            do(c.FailPayment(payment_id=payment_id, reason=f"declined: {e}"), "payment-fail")
            return do(c.RecordFulfilmentFailure(order_id=order.id, step="charge", reason=f"declined: {e}"),
                      "charge-failed")
        except GatewayUnavailable as e:  # the outcome may be unknown: the compensation voids under the same key
            return do(c.RecordFulfilmentFailure(order_id=order.id, step="charge",
                                                reason=f"gateway unavailable after {self.attempts} attempts: {e}"),
                      "charge-failed")
        self.on_boundary("charge:authorized")
        do(c.RecordFulfilmentStep(order_id=order.id, step="charge", detail=reference), "charged")

    def _confirm(self, order: Order, do: Callable[[c.Command, str], None]) -> None:
        try:
            do(c.ConfirmOrder(order_id=order.id), "confirm")
        except IllegalTransition as e:
            return do(c.RecordFulfilmentFailure(order_id=order.id, step="confirm", reason=str(e)), "confirm-failed")
        self.on_boundary("confirm:confirmed")
        try:
            reference = self._retrying(lambda: self.gateway.capture(self.gateway_key(order.id)))
        except (GatewayDeclined, GatewayUnavailable) as e:
            return do(c.RecordFulfilmentFailure(order_id=order.id, step="confirm", reason=f"capture failed: {e}"),
                      "confirm-failed")
        self.on_boundary("confirm:captured")
        do(c.CompletePayment(payment_id=payment_id_for(order.id)), "payment-complete")
        do(c.RecordFulfilmentStep(order_id=order.id, step="confirm", detail=reference), "confirmed")

    # -- compensation -------------------------------------------------------------

    def _compensate(self, saga: OrderFulfilment, order: Order, do: Callable[[c.Command, str], None],
                    tenant: str) -> None:
        for step in saga.to_compensate:
            undo = {"reserve": self._release, "charge": self._void,
                    "confirm": lambda o, t: "order to be cancelled"}[step]
            try:
                detail = self._retrying(lambda: undo(order, tenant), retry_on=Exception)
            except Exception as e:
                reason = f"{type(e).__name__}: {e}"
                log.critical("fulfilment of order %s is STUCK undoing %s after %d attempts: %s; manual "
                             "intervention needed", order.id, step, self.attempts, reason)
                return do(c.MarkFulfilmentStuck(order_id=order.id, step=step, reason=reason, attempts=self.attempts),
                          f"stuck-{step}-at-{saga.version}")
            self.on_boundary(f"compensate:{step}")
            do(c.RecordCompensation(order_id=order.id, step=step, detail=detail), f"undone-{step}")
        if self._load(Order, order.id, tenant).state is not OrderState.CANCELLED:
            try:
                do(c.CancelOrderAfterFailure(order_id=order.id, reason=saga.failure or "fulfilment failed"), "cancel")
            except IllegalTransition:
                pass  # cancelled meanwhile by the customer
        do(c.RecordFulfilmentCancelled(order_id=order.id, reason=saga.failure or "fulfilment failed"), "cancelled")

    def _release(self, order: Order, tenant: str) -> str:
        try:
            self.processor.dispatch(c.ReleaseReservation(item_id=order.item_id, reservation_id=str(order.id)),
                                    idempotency_key=f"fulfilment/{order.id}/release", tenant=tenant)
        except (UnknownReservation, IllegalTransition, AggregateNotFound):  # no such item for this tenant
            return "nothing reserved"
        return f"{order.quantity} released"

    def _void(self, order: Order, tenant: str) -> str:
        self.gateway.void(self.gateway_key(order.id))
        payment = self._load(PaymentTransaction, payment_id_for(order.id), tenant)
        if payment.state is PaymentState.PENDING:
            self.processor.dispatch(c.FailPayment(payment_id=payment.id, reason="order cancelled: authorization voided"),
                                    idempotency_key=f"fulfilment/{order.id}/payment-void", tenant=tenant)
        return "authorization voided"

    def park(self, order_id: UUID, reason: str, attempts: int, tenant: str = "default") -> None:
        """Record that advancing ``order_id``'s saga kept failing: it waits for ``commitline sagas retry``."""
        saga = self._load(OrderFulfilment, fulfilment_id(order_id), tenant)
        log.critical("fulfilment of order %s is PARKED after %d failed attempts: %s; fix the cause, then run "
                     "commitline sagas retry %s", order_id, attempts, reason, order_id)
        self.processor.dispatch(c.ParkFulfilment(order_id=order_id, reason=reason[:2000], attempts=attempts),
                                idempotency_key=f"fulfilment/{order_id}/park-at-{saga.version}", tenant=tenant)

    # -- helpers ------------------------------------------------------------------

    def order_of(self, saga_id: UUID, tenant: str = "default") -> UUID:
        """The order a fulfilment saga (by its own id) belongs to."""
        order_id = self._load(OrderFulfilment, saga_id, tenant).order_id
        if order_id is None:
            raise AggregateNotFound(OrderFulfilment.__name__, saga_id)
        return order_id

    def _load(self, cls: type[A], aggregate_id: UUID, tenant: str) -> A:
        """``cls`` as the tenant sees it: another tenant's stream does not exist (AggregateNotFound)."""
        try:
            return self.store.load(cls, aggregate_id, tenant=tenant)
        except ForeignStream:
            raise AggregateNotFound(cls.__name__, aggregate_id) from None

    @staticmethod
    def gateway_key(order_id: UUID) -> str:
        return f"order/{order_id}"

    def _retrying(self, call: Callable[[], str], retry_on: type[Exception] = GatewayUnavailable) -> str:
        """``call()``, repeated while it raises ``retry_on``, at most ``attempts`` times, pausing ``backoff``
        seconds, doubled per retry; the last error is re-raised."""
        return Retrying(stop=stop_after_attempt(self.attempts), wait=wait_exponential(multiplier=self.backoff),
                        retry=retry_if_exception_type(retry_on), reraise=True)(call)
