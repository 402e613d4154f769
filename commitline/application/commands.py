"""Commands: frozen, strictly validated pydantic models, one per state change.

Strict means no silent coercion: a quantity must be an integer (not ``"5"`` or ``5.0``),
an amount a decimal string or integer (never a binary float), unknown fields are
rejected. Ids and amounts may arrive as JSON strings. ``parse_command`` accepts a model,
a mapping or JSON text with a ``"type"`` field and raises typed errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal
from uuid import UUID

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from commitline.application.errors import InvalidCommand, UnknownCommandType
from commitline.domain.errors import InvalidValue
from commitline.domain.money import check_amount, check_currency
from commitline.domain.survey import MAX_USERS_PER_ISSUE


def _no_float(value: Any) -> Any:
    if isinstance(value, float):
        raise ValueError("amounts must be given as a decimal string or an integer, never a binary float")
    return value


Amount = Annotated[Decimal, BeforeValidator(_no_float), Field(strict=False, allow_inf_nan=False)]
Id = Annotated[UUID, Field(strict=False)]
Version = Annotated[int, Field(ge=0)]
Quantity = Annotated[int, Field(gt=0, le=10**12)]
Text = Annotated[str, Field(min_length=1, max_length=200)]
UserId = Annotated[str, Field(min_length=1, max_length=128)]


class Command(BaseModel):
    """Base of every command. ``type`` names it in JSON; ``creates`` marks commands that start a new
    stream. The aggregate a command changes is declared by its handler (``application.handlers.HANDLERS``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, str_strip_whitespace=False)

    type: str
    creates: ClassVar[bool] = False


class VersionedCommand(Command):
    """A command on an existing stream; ``expected_version`` makes it fail fast if the stream moved."""

    expected_version: Version | None = None


class PricedCommand(Command):
    """A command carrying money: an ISO 4217 currency and an amount that fits its minor unit."""

    currency: Annotated[str, Field(min_length=3, max_length=3)]
    amount: Amount

    @field_validator("currency")
    @classmethod
    def _iso_currency(cls, code: str) -> str:
        return _domain_check(check_currency, code)

    @field_validator("amount")
    @classmethod
    def _amount_fits_currency(cls, amount: Decimal, info: ValidationInfo) -> Decimal:
        currency = info.data.get("currency")
        if currency is None:  # the currency error is reported on its own field
            return amount
        return _domain_check(check_amount, amount, currency)


class CreatePayment(PricedCommand):
    type: Literal["create_payment"] = "create_payment"
    creates: ClassVar[bool] = True
    payment_id: Id | None = None
    account: Text


class SubmitPayment(VersionedCommand):
    type: Literal["submit_payment"] = "submit_payment"
    payment_id: Id


class CompletePayment(VersionedCommand):
    type: Literal["complete_payment"] = "complete_payment"
    payment_id: Id


class FailPayment(VersionedCommand):
    type: Literal["fail_payment"] = "fail_payment"
    payment_id: Id
    reason: Text


class ReceiveStock(VersionedCommand):
    type: Literal["receive_stock"] = "receive_stock"
    item_id: Id
    quantity: Quantity


class ReserveStock(VersionedCommand):
    type: Literal["reserve_stock"] = "reserve_stock"
    item_id: Id
    reservation_id: Text
    quantity: Quantity


class ReleaseReservation(VersionedCommand):
    type: Literal["release_reservation"] = "release_reservation"
    item_id: Id
    reservation_id: Text


class FulfilReservation(VersionedCommand):
    type: Literal["fulfil_reservation"] = "fulfil_reservation"
    item_id: Id
    reservation_id: Text


class CreateSurveyTask(Command):
    type: Literal["create_survey_task"] = "create_survey_task"
    creates: ClassVar[bool] = True
    task_id: Id | None = None
    title: Text


class IssueSurveyTask(VersionedCommand):
    type: Literal["issue_survey_task"] = "issue_survey_task"
    task_id: Id
    user_ids: Annotated[tuple[UserId, ...], Field(min_length=1, max_length=MAX_USERS_PER_ISSUE)]


class AnswerSurveyTask(Command):
    type: Literal["answer_survey_task"] = "answer_survey_task"
    task_id: Id
    user_id: UserId


class CloseSurveyTask(VersionedCommand):
    type: Literal["close_survey_task"] = "close_survey_task"
    task_id: Id


class PlaceOrder(PricedCommand):
    type: Literal["place_order"] = "place_order"
    creates: ClassVar[bool] = True
    order_id: Id | None = None
    item_id: Id
    quantity: Quantity
    account: Text


class CancelOrder(VersionedCommand):
    type: Literal["cancel_order"] = "cancel_order"
    order_id: Id
    reason: Text


class ConfirmOrder(VersionedCommand):
    type: Literal["confirm_order"] = "confirm_order"
    order_id: Id


class SagaCommand(Command):
    """Recorded by the order-fulfilment process manager only: never accepted as JSON."""

    order_id: Id


class StartFulfilment(SagaCommand):
    type: Literal["start_fulfilment"] = "start_fulfilment"


class RecordFulfilmentStep(SagaCommand):
    type: Literal["record_fulfilment_step"] = "record_fulfilment_step"
    step: Text
    detail: Annotated[str, Field(max_length=2000)]


class RecordFulfilmentFailure(SagaCommand):
    type: Literal["record_fulfilment_failure"] = "record_fulfilment_failure"
    step: Text
    reason: Annotated[str, Field(min_length=1, max_length=2000)]


class RecordCompensation(SagaCommand):
    type: Literal["record_compensation"] = "record_compensation"
    step: Text
    detail: Annotated[str, Field(max_length=2000)]


class RecordFulfilmentCancelled(SagaCommand):
    type: Literal["record_fulfilment_cancelled"] = "record_fulfilment_cancelled"
    reason: Annotated[str, Field(min_length=1, max_length=2000)]


class MarkFulfilmentStuck(SagaCommand):
    type: Literal["mark_fulfilment_stuck"] = "mark_fulfilment_stuck"
    step: Text
    reason: Annotated[str, Field(min_length=1, max_length=2000)]
    attempts: Annotated[int, Field(ge=1)]


class RetryFulfilment(SagaCommand):
    type: Literal["retry_fulfilment"] = "retry_fulfilment"


SAGA_COMMANDS = (StartFulfilment, RecordFulfilmentStep, RecordFulfilmentFailure, RecordCompensation,
                 RecordFulfilmentCancelled, MarkFulfilmentStuck, RetryFulfilment)

COMMAND_TYPES: dict[str, type[Command]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        CreatePayment, SubmitPayment, CompletePayment, FailPayment,
        ReceiveStock, ReserveStock, ReleaseReservation, FulfilReservation,
        CreateSurveyTask, IssueSurveyTask, AnswerSurveyTask, CloseSurveyTask,
        PlaceOrder, CancelOrder, ConfirmOrder,
    )
}


def _domain_check(check: Any, *args: Any) -> Any:
    try:
        return check(*args)
    except InvalidValue as e:
        raise ValueError(e.reason) from None


def parse_command(command: Command | Mapping[str, Any] | str | bytes) -> Command:
    """Validate a command given as a model, a mapping or JSON; raise InvalidCommand or UnknownCommandType."""
    if isinstance(command, Command):
        return command
    if isinstance(command, (str, bytes)):
        try:
            data = orjson.loads(command)
        except orjson.JSONDecodeError as e:
            raise InvalidCommand(None, [{"loc": [], "msg": f"not valid JSON: {e}", "type": "json_invalid"}]) from None
        if not isinstance(data, dict):
            raise InvalidCommand(None, [{"loc": [], "msg": "a command must be a JSON object", "type": "json_type"}])
        command = data
    if not isinstance(command, Mapping):
        raise InvalidCommand(None, [{"loc": [], "msg": f"cannot read a command from {type(command).__name__}",
                                     "type": "command_type"}])
    command_type = command.get("type")
    cls = COMMAND_TYPES.get(command_type) if isinstance(command_type, str) else None
    if cls is None:
        raise UnknownCommandType(command_type, sorted(COMMAND_TYPES))
    try:
        # JSON-compatible input is validated in JSON mode, where ids and decimals arrive as strings.
        return cls.model_validate_json(orjson.dumps(dict(command), default=str))
    except ValidationError as e:
        errors = [{"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]} for err in e.errors()]
        raise InvalidCommand(command_type, errors) from None
