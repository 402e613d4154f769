"""The read models: per-task user counts by status, payment totals by state and currency
with a per-payment lookup, and inventory levels. Each is tables plus handlers."""

from __future__ import annotations

from commitline.domain.inventory import ReservationFulfilled, ReservationReleased, StockReceived, StockReserved
from commitline.domain.fulfilment import (
    AFTER_STEP,
    FulfilmentCancelled,
    FulfilmentParked,
    FulfilmentRetried,
    FulfilmentStarted,
    FulfilmentStepCompleted,
    FulfilmentStepFailed,
    FulfilmentStuck,
    SagaState,
)
from commitline.domain.payment import PaymentCompleted, PaymentCreated, PaymentFailed, PaymentState, PaymentSubmitted
from commitline.domain.survey import AssignmentStatus, SurveyTaskAnswered, SurveyTaskCreated, SurveyTaskIssued
from commitline.infrastructure.store.codec import RecordedEvent
from commitline.projections.base import Changes, Key, Projection, Table, on

PENDING, DONE = AssignmentStatus.PENDING.value, AssignmentStatus.DONE.value


class TaskStatuses(Projection):
    """Users per (survey task, status). Issue adds PENDING users; an answer moves one to DONE."""

    name = "task_statuses"
    tables = (
        Table("rm_task_statuses", {"task_id": "uuid", "status": "text", "tenant": "text", "users": "bigint"},
              key=("task_id", "status"), counters=("users",)),
    )

    @on(SurveyTaskCreated)
    def created(self, changes: Changes, r: RecordedEvent) -> None:
        for status in AssignmentStatus:
            changes.add("rm_task_statuses", (r.event.aggregate_id, status.value), users=0)
            changes.put("rm_task_statuses", (r.event.aggregate_id, status.value), tenant=r.tenant)

    @on(SurveyTaskIssued)
    def issued(self, changes: Changes, r: RecordedEvent) -> None:
        changes.add("rm_task_statuses", (r.event.aggregate_id, PENDING), users=len(r.event.user_ids))

    @on(SurveyTaskAnswered)
    def answered(self, changes: Changes, r: RecordedEvent) -> None:
        changes.add("rm_task_statuses", (r.event.task_id, PENDING), users=-1)
        changes.add("rm_task_statuses", (r.event.task_id, DONE), users=1)


def _payment_key(r: RecordedEvent) -> Key | None:
    if r.aggregate_type == "PaymentTransaction" and not isinstance(r.event, PaymentCreated):
        return (r.event.aggregate_id,)
    return None


class PaymentStates(Projection):
    """Payments per (tenant, state, currency) with their total amount, and each payment's current state."""

    name = "payment_states"
    tables = (
        Table("rm_payments", {"payment_id": "uuid", "tenant": "text", "state": "text", "amount": "numeric",
                              "currency": "text"}, key=("payment_id",)),
        Table("rm_payment_totals", {"tenant": "text", "state": "text", "currency": "text", "payments": "bigint",
                                    "amount": "numeric"}, key=("tenant", "state", "currency"),
              counters=("payments", "amount")),
    )
    prefetch = {"rm_payments": _payment_key}

    @on(PaymentCreated)
    def created(self, changes: Changes, r: RecordedEvent) -> None:
        e = r.event
        changes.put("rm_payments", (e.aggregate_id,), tenant=r.tenant, state=PaymentState.CREATED.value,
                    amount=e.amount, currency=e.currency)
        changes.add("rm_payment_totals", (r.tenant, PaymentState.CREATED.value, e.currency), payments=1,
                    amount=e.amount)

    @on(PaymentSubmitted)
    def submitted(self, changes: Changes, r: RecordedEvent) -> None:
        self._move(changes, r, PaymentState.PENDING)

    @on(PaymentCompleted)
    def completed(self, changes: Changes, r: RecordedEvent) -> None:
        self._move(changes, r, PaymentState.COMPLETED)

    @on(PaymentFailed)
    def failed(self, changes: Changes, r: RecordedEvent) -> None:
        self._move(changes, r, PaymentState.FAILED)

    @staticmethod
    def _move(changes: Changes, r: RecordedEvent, target: PaymentState) -> None:
        payment = changes.get("rm_payments", (r.event.aggregate_id,))
        if payment is None:
            raise LookupError(f"payment {r.event.aggregate_id} changed state before it was created")
        tenant, currency, amount = payment["tenant"], payment["currency"], payment["amount"]
        changes.add("rm_payment_totals", (tenant, payment["state"], currency), payments=-1, amount=-amount)
        changes.add("rm_payment_totals", (tenant, target.value, currency), payments=1, amount=amount)
        changes.put("rm_payments", (r.event.aggregate_id,), state=target.value)


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


class OrderFulfilments(Projection):
    """Each order's fulfilment saga: where it stands, why it failed, whether it is stuck."""

    name = "order_fulfilments"
    tables = (
        Table("rm_order_fulfilments", {"saga_id": "uuid", "order_id": "uuid", "tenant": "text", "state": "text",
                                       "failure": "text", "stuck": "text"}, key=("saga_id",)),
    )

    def _put(self, changes: Changes, r: RecordedEvent, **values: object) -> None:
        changes.put("rm_order_fulfilments", (r.event.aggregate_id,), **values)

    @on(FulfilmentStarted)
    def started(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, order_id=r.event.order_id, tenant=r.tenant, state=SagaState.STARTED.value)

    @on(FulfilmentStepCompleted)
    def step_completed(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=AFTER_STEP[r.event.step].value)

    @on(FulfilmentStepFailed)
    def step_failed(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=SagaState.COMPENSATING.value, failure=f"{r.event.step}: {r.event.reason}")

    @on(FulfilmentCancelled)
    def cancelled(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=SagaState.COMPENSATED.value)

    @on(FulfilmentStuck)
    def stuck(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=SagaState.STUCK.value,
                  stuck=f"{r.event.step}: {r.event.reason} (after {r.event.attempts} attempts)")

    @on(FulfilmentParked)
    def parked(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, order_id=r.event.order_id, tenant=r.tenant, state=SagaState.PARKED.value,
                  stuck=f"{r.event.reason} (after {r.event.attempts} attempts)")

    @on(FulfilmentRetried)
    def retried(self, changes: Changes, r: RecordedEvent) -> None:
        self._put(changes, r, state=r.event.resumed.value, stuck="")


PROJECTIONS: dict[str, type[Projection]] = {
    p.name: p for p in (TaskStatuses, PaymentStates, InventoryLevels, OrderFulfilments)
}
