"""Commands: frozen, strictly validated pydantic models, one per state change.

Strict means no silent coercion: a quantity must be an integer (not ``"5"`` or ``5.0``),
an amount a decimal string or integer (never a binary float), unknown fields are
rejected. Ids and amounts may arrive as JSON strings. ``parse_command`` accepts a model,
a mapping or JSON text with a ``"type"`` field, passes it through the boundary
(``application.boundary``: JSON values only, within ``CommandLimits``) and raises typed errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from functools import cache
from typing import Annotated, Any, ClassVar, Literal, get_args
from uuid import UUID

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from commitline.application.boundary import DEFAULT_LIMITS, CommandLimits, check_json, problem, read_json, too_large
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


class CancelOrderAfterFailure(SagaCommand):
    """The saga's compensation: cancels the order even once confirmed (its capture failed)."""

    type: Literal["cancel_order_after_failure"] = "cancel_order_after_failure"
    reason: Annotated[str, Field(min_length=1, max_length=2000)]


class ParkFulfilment(SagaCommand):
    type: Literal["park_fulfilment"] = "park_fulfilment"
    reason: Annotated[str, Field(min_length=1, max_length=2000)]
    attempts: Annotated[int, Field(ge=1)]


SAGA_COMMANDS = (StartFulfilment, RecordFulfilmentStep, RecordFulfilmentFailure, RecordCompensation,
                 RecordFulfilmentCancelled, MarkFulfilmentStuck, RetryFulfilment, ParkFulfilment,
                 CancelOrderAfterFailure)

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


def parse_command(command: Command | Mapping[str, Any] | str | bytes, *,
                  limits: CommandLimits = DEFAULT_LIMITS) -> Command:
    """Validate a command given as a model, a mapping or JSON; raise InvalidCommand or UnknownCommandType.

    A model is checked like a mapping of its fields and validated again (``model_construct`` skips
    validation); it is returned itself when valid.
    """
    if isinstance(command, Command):
        cls: type[Command] | None = type(command)
        data: dict[Any, Any] = dict(command)
        check_json(data, limits, command_type=command.type, objects=_object_fields(cls))
    elif isinstance(command, (str, bytes, bytearray)):
        value = read_json(command, limits)
        if not isinstance(value, dict):
            raise InvalidCommand(None, [problem([], "a command must be a JSON object", "json_type")])
        data, cls = value, _command_class(value)
    elif isinstance(command, Mapping):
        data = dict(command)
        cls = _command_class(data)
        objects = _object_fields(cls) if cls else None
        check_json(data, limits, command_type=data["type"] if cls else None, objects=objects)
    else:
        raise InvalidCommand(None, [problem([], f"cannot read a command from {type(command).__name__}",
                                            "command_type")])
    if cls is None:
        raise UnknownCommandType(data.get("type"), sorted(COMMAND_TYPES))
    try:
        # Validated in JSON mode, where ids and decimals arrive as strings and arrays as lists.
        text = orjson.dumps(data, default=_json_object)
    except (TypeError, orjson.JSONEncodeError) as e:  # not expected after check_json: still a typed error
        raise InvalidCommand(data["type"], [problem([], f"not JSON: {e}", "json_type")]) from None
    if len(text) > limits.max_bytes:
        raise InvalidCommand(data["type"], [too_large([], limits)])
    try:
        parsed = cls.model_validate_json(text)
    except ValidationError as e:
        errors = [{"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]} for err in e.errors()]
        raise InvalidCommand(data["type"], errors) from None
    return command if isinstance(command, Command) else parsed


def _command_class(data: dict[Any, Any]) -> type[Command] | None:
    command_type = data.get("type")
    return COMMAND_TYPES.get(command_type) if isinstance(command_type, str) else None


@cache
def _object_fields(cls: type[Command]) -> dict[str, tuple[type, ...]]:
    """The fields of ``cls`` that a Python mapping may give as UUID or Decimal objects."""
    def types(annotation: Any) -> set[Any]:  # through Annotated[...] and X | None
        return {annotation}.union(*(types(arg) for arg in get_args(annotation)))

    fields = {}
    for name, info in cls.model_fields.items():
        if accepted := tuple(t for t in (UUID, Decimal) if t in types(info.annotation)):
            fields[name] = accepted
    return fields


def _json_object(value: Any) -> str:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
