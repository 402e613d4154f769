"""Command handlers: which aggregate each command changes, and the domain call it makes.

A handler receives the loaded aggregate (blank when its stream is empty) and a loader
for reading other, existing aggregates of the command's tenant (it raises AggregateNotFound for one
that does not exist or belongs to another tenant); it calls one domain method and returns the aggregate
holding the new events. Loading, tenancy, concurrency and idempotency are the processor's job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any
from uuid import UUID

from commitline.application import commands as c
from commitline.domain import Aggregate
from commitline.domain.inventory import InventoryItem
from commitline.domain.fulfilment import OrderFulfilment, fulfilment_id
from commitline.domain.order import Order
from commitline.domain.payment import PaymentTransaction
from commitline.domain.survey import SurveyAssignment, SurveyTask, assignment_id

Loader = Callable[[type[Aggregate], UUID], Aggregate]


class Stream(Enum):
    NEW = "the stream must be empty"
    EXISTING = "the stream must already exist"
    ANY = "either"


@dataclass(frozen=True)
class Handler:
    aggregate: type[Aggregate]
    stream: Stream
    target: Callable[[Any], UUID | None]
    run: Callable[[Any, Any, Loader], Aggregate]


HANDLERS: dict[type[c.Command], Handler] = {}


def handles(command: type[c.Command], aggregate: type[Aggregate], stream: Stream, target: Callable[[Any], UUID | None]):
    def register(run: Callable[[Any, Any, Loader], Aggregate]) -> Callable[[Any, Any, Loader], Aggregate]:
        HANDLERS[command] = Handler(aggregate, stream, target, run)
        return run

    return register


def _payment(cmd: Any) -> UUID | None:
    return cmd.payment_id


def _item(cmd: Any) -> UUID:
    return cmd.item_id


def _task(cmd: Any) -> UUID | None:
    return cmd.task_id


def _assignment(cmd: c.AnswerSurveyTask) -> UUID:
    return assignment_id(cmd.task_id, cmd.user_id)


@handles(c.CreatePayment, PaymentTransaction, Stream.NEW, _payment)
def create_payment(p: PaymentTransaction, cmd: c.CreatePayment, _: Loader) -> Aggregate:
    return PaymentTransaction.create(p.id, amount=cmd.amount, currency=cmd.currency, account=cmd.account)


@handles(c.SubmitPayment, PaymentTransaction, Stream.EXISTING, _payment)
def submit_payment(p: PaymentTransaction, cmd: c.SubmitPayment, _: Loader) -> Aggregate:
    p.submit()
    return p


@handles(c.CompletePayment, PaymentTransaction, Stream.EXISTING, _payment)
def complete_payment(p: PaymentTransaction, cmd: c.CompletePayment, _: Loader) -> Aggregate:
    p.complete()
    return p


@handles(c.FailPayment, PaymentTransaction, Stream.EXISTING, _payment)
def fail_payment(p: PaymentTransaction, cmd: c.FailPayment, _: Loader) -> Aggregate:
    p.fail(cmd.reason)
    return p


@handles(c.ReceiveStock, InventoryItem, Stream.ANY, _item)
def receive_stock(item: InventoryItem, cmd: c.ReceiveStock, _: Loader) -> Aggregate:
    item.receive(cmd.quantity)
    return item


@handles(c.ReserveStock, InventoryItem, Stream.EXISTING, _item)
def reserve_stock(item: InventoryItem, cmd: c.ReserveStock, _: Loader) -> Aggregate:
    item.reserve(cmd.reservation_id, cmd.quantity)
    return item


@handles(c.ReleaseReservation, InventoryItem, Stream.EXISTING, _item)
def release_reservation(item: InventoryItem, cmd: c.ReleaseReservation, _: Loader) -> Aggregate:
    item.release(cmd.reservation_id)
    return item


@handles(c.FulfilReservation, InventoryItem, Stream.EXISTING, _item)
def fulfil_reservation(item: InventoryItem, cmd: c.FulfilReservation, _: Loader) -> Aggregate:
    item.fulfil(cmd.reservation_id)
    return item


@handles(c.CreateSurveyTask, SurveyTask, Stream.NEW, _task)
def create_survey_task(task: SurveyTask, cmd: c.CreateSurveyTask, _: Loader) -> Aggregate:
    return SurveyTask.create(task.id, cmd.title)


@handles(c.IssueSurveyTask, SurveyTask, Stream.EXISTING, _task)
def issue_survey_task(task: SurveyTask, cmd: c.IssueSurveyTask, _: Loader) -> Aggregate:
    task.issue(cmd.user_ids)
    return task


@handles(c.CloseSurveyTask, SurveyTask, Stream.EXISTING, _task)
def close_survey_task(task: SurveyTask, cmd: c.CloseSurveyTask, _: Loader) -> Aggregate:
    task.close()
    return task


@handles(c.AnswerSurveyTask, SurveyAssignment, Stream.ANY, _assignment)
def answer_survey_task(assignment: SurveyAssignment, cmd: c.AnswerSurveyTask, load: Loader) -> Aggregate:
    task = load(SurveyTask, cmd.task_id)
    assert isinstance(task, SurveyTask)
    assignment.answer(task, cmd.user_id)
    return assignment


def _order(cmd: Any) -> UUID | None:
    return cmd.order_id


def _saga(cmd: c.SagaCommand) -> UUID:
    return fulfilment_id(cmd.order_id)


@handles(c.PlaceOrder, Order, Stream.NEW, _order)
def place_order(order: Order, cmd: c.PlaceOrder, _: Loader) -> Aggregate:
    return Order.place(order.id, item_id=cmd.item_id, quantity=cmd.quantity, amount=cmd.amount,
                       currency=cmd.currency, account=cmd.account)


@handles(c.CancelOrder, Order, Stream.EXISTING, _order)
def cancel_order(order: Order, cmd: c.CancelOrder, _: Loader) -> Aggregate:
    order.cancel(cmd.reason)
    return order


@handles(c.CancelOrderAfterFailure, Order, Stream.EXISTING, _order)
def cancel_order_after_failure(order: Order, cmd: c.CancelOrderAfterFailure, _: Loader) -> Aggregate:
    order.cancel(cmd.reason, compensation=True)
    return order


@handles(c.ConfirmOrder, Order, Stream.EXISTING, _order)
def confirm_order(order: Order, cmd: c.ConfirmOrder, _: Loader) -> Aggregate:
    order.confirm()
    return order


@handles(c.StartFulfilment, OrderFulfilment, Stream.NEW, _saga)
def start_fulfilment(saga: OrderFulfilment, cmd: c.StartFulfilment, load: Loader) -> Aggregate:
    load(Order, cmd.order_id)  # the order must exist
    return OrderFulfilment.start(cmd.order_id)


@handles(c.ParkFulfilment, OrderFulfilment, Stream.ANY, _saga)
def park_fulfilment(saga: OrderFulfilment, cmd: c.ParkFulfilment, load: Loader) -> Aggregate:
    load(Order, cmd.order_id)  # the order must exist (a saga may be parked before it started)
    saga.park(cmd.order_id, cmd.reason, cmd.attempts)
    return saga


# The process manager's records of its own progress: each calls one method of the saga aggregate.
SAGA_RECORDS: dict[type[c.SagaCommand], Callable[[OrderFulfilment, Any], None]] = {
    c.RecordFulfilmentStep: lambda saga, cmd: saga.step_completed(cmd.step, cmd.detail),
    c.RecordFulfilmentFailure: lambda saga, cmd: saga.step_failed(cmd.step, cmd.reason),
    c.RecordCompensation: lambda saga, cmd: saga.compensated_step(cmd.step, cmd.detail),
    c.RecordFulfilmentCancelled: lambda saga, cmd: saga.cancelled(cmd.reason),
    c.MarkFulfilmentStuck: lambda saga, cmd: saga.stuck_at(cmd.step, cmd.reason, cmd.attempts),
    c.RetryFulfilment: lambda saga, cmd: saga.retry(),
}


def _recording(record: Callable[[OrderFulfilment, Any], None]) -> Callable[[Any, Any, Loader], Aggregate]:
    def run(saga: OrderFulfilment, cmd: Any, _: Loader) -> Aggregate:
        record(saga, cmd)
        return saga

    return run


for _command, _record in SAGA_RECORDS.items():
    handles(_command, OrderFulfilment, Stream.EXISTING, _saga)(_recording(_record))


missing = (set(c.COMMAND_TYPES.values()) | set(c.SAGA_COMMANDS)) - set(HANDLERS)
assert not missing, f"commands without a handler: {missing}"
