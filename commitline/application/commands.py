"""Commands: frozen, strictly validated pydantic models, one per state change.

Strict means no silent coercion: a quantity must be an integer (not ``"5"`` or ``5.0``),
an amount a decimal string or integer (never a binary float), unknown fields are
rejected. Ids and amounts may arrive as JSON strings. A command's ``type`` (its name in JSON)
is the class name in snake case (``PlaceTrade`` -> ``place_trade``) unless the class declares
``type: Literal["..."] = "..."`` itself.

``parse_command`` accepts a model, a mapping or JSON text with a ``"type"`` field, passes it through
the boundary (``application.boundary``: JSON values only, within ``CommandLimits``), looks the type up
among the commands a domain accepts from outside (its ``CommandCatalog``) and raises typed errors.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from decimal import Decimal
from functools import cache
import re
from typing import Annotated, Any, Literal, Protocol, get_args, get_origin
from uuid import UUID

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema
from pydantic_core import PydanticSerializationError

from commitline.application.amounts import DECIMAL_TEXT, Amount, float_decimals, may_take_float_decimals
from commitline.application.boundary import (DEFAULT_LIMITS, CommandLimits, at_most, check_json, problem, read_json,
                                             too_large)
from commitline.application.errors import InternalCommandType, InvalidCommand, UnknownCommandType


UUID_TEXT = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_UUID_TEXT = re.compile(UUID_TEXT)


def uuid_text(value: Any) -> Any:
    """A UUID given as text only in its 8-4-4-4-12 form (pydantic also reads 32 digits, braces, ``urn:uuid:``)."""
    if isinstance(value, str) and not _UUID_TEXT.fullmatch(value):  # not match: "$" passes a final newline
        raise ValueError("an id is a UUID in its 8-4-4-4-12 hexadecimal form")
    return value


Id = Annotated[UUID, BeforeValidator(uuid_text), Field(strict=False),
               WithJsonSchema({"type": "string", "format": "uuid", "pattern": UUID_TEXT})]
"""an aggregate id: a UUID, given as its 8-4-4-4-12 string in JSON"""
Version = Annotated[int, Field(ge=0)]
Quantity = Annotated[int, Field(gt=0, le=10**12)]
"""a positive whole number of units, at most 10^12"""
Text = Annotated[str, Field(min_length=1, max_length=200)]
"""1 to 200 characters"""
NonBlankText = Annotated[str, Field(min_length=1, max_length=200, pattern=r"\S")]
"""1 to 200 characters, not all of them white space (a name, a title, an account)"""

_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def type_name_of(class_name: str) -> str:
    """A command class's default type: its name in snake case (``PlaceTrade`` -> ``place_trade``)."""
    return _WORD_START.sub("_", class_name).lower()


class Command(BaseModel):
    """Base of every command. ``type`` names it in JSON (by default the class name in snake case). The
    aggregate a command changes, and how its id is found, are declared with its handler (``Domain.handles``)."""

    # allow_inf_nan: JSON (over HTTP) cannot carry a NaN or an infinity, and an event could not store one: a
    # command given one in Python is refused as invalid, naming the field, as any other value out of its range
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, str_strip_whitespace=False,
                              allow_inf_nan=False)

    type: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Runs before pydantic collects the fields, so the added annotation becomes the ``type`` field.
        own = cls.__dict__.get("__annotations__", {})
        if "type" not in own:
            name = type_name_of(cls.__name__)
            cls.__annotations__ = {**own, "type": Literal[name]}
            cls.type = name  # type: ignore[assignment]
        super().__init_subclass__(**kwargs)

    @classmethod
    def type_name(cls) -> str:
        """The ``type`` this command has in JSON."""
        return str(cls.model_fields["type"].default)


class VersionedCommand(Command):
    """A command on an existing stream; ``expected_version`` makes it fail fast if the stream moved."""

    expected_version: Version | None = None


class KnownCommands(Protocol):
    """What parsing needs to know of a domain's commands (``catalog.CommandCatalog`` is one)."""

    public: Mapping[str, type[Command]]
    known_types: Collection[str]  # every command type it handles, its process managers' own included

    def holds(self, command: type[Command]) -> bool: ...

    def public_types(self) -> list[str]: ...


def parse_command(command: Command | Mapping[str, Any] | str | bytes, catalog: KnownCommands, *,
                  limits: CommandLimits = DEFAULT_LIMITS) -> Command:
    """Validate a command given as a model, a mapping or JSON; raise InvalidCommand or UnknownCommandType.

    A mapping or JSON names its class by ``type``, among the commands ``catalog`` accepts from outside
    (never a process manager's own). A model must be of a command class the catalog holds; it is checked
    like a mapping of its fields and validated again (``model_construct`` skips validation); it is
    returned itself when valid.
    """
    if isinstance(command, Command):
        cls: type[Command] | None = type(command)
        if not catalog.holds(type(command)):
            ours = catalog.public.get(command.type)
            if ours is not None:  # the same type name, another class: "unknown type X; known: X" would puzzle
                raise InvalidCommand(command.type, [problem([], (
                    f"this domain's {command.type} is {ours.__module__}.{ours.__qualname__}, not "
                    f"{type(command).__module__}.{type(command).__qualname__} (a class of another domain or module "
                    "with the same type)"), "command_type")])
            raise UnknownCommandType(command.type, catalog.public_types())
        try:  # its JSON values (dates, nested models, ids and amounts as text), defaults left out as JSON does
            data: dict[Any, Any] = {**command.model_dump(mode="json", exclude_unset=True, warnings=False),
                                    "type": command.type}
        except PydanticSerializationError as e:  # a model_construct'ed value JSON cannot hold
            raise InvalidCommand(command.type, [problem([], f"not JSON: {e}", "json_type")]) from None
        check_json(data, limits, command_type=command.type)
    elif isinstance(command, (str, bytes, bytearray)):
        value = read_json(command, limits, known=catalog.public.__contains__)
        if not isinstance(value, dict):
            raise InvalidCommand(None, [problem([], "a command must be a JSON object", "json_type")])
        data, cls = value, _command_class(value, catalog)
    elif isinstance(command, Mapping):
        data = dict(command)
        cls = _command_class(data, catalog)
        objects = _object_fields(cls) if cls else None
        check_json(data, limits, command_type=data["type"] if cls else None, objects=objects)
    else:
        raise InvalidCommand(None, [problem([], f"cannot read a command from {type(command).__name__}",
                                            "command_type")])
    if cls is None:
        internal = isinstance(data.get("type"), str) and data["type"] in catalog.known_types
        raise (InternalCommandType if internal else UnknownCommandType)(data.get("type"), catalog.public_types())
    if may_take_float_decimals(cls) and (floats := float_decimals(cls, data)):
        raise InvalidCommand(data["type"], at_most(floats))
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
        # a validator's own words, without pydantic's "Value error, " in front
        errors = [{"loc": list(err["loc"]), "msg": err["msg"].removeprefix("Value error, "), "type": err["type"]}
                  for err in e.errors()]
        raise InvalidCommand(data["type"], at_most(errors)) from None
    return command if isinstance(command, Command) else parsed


def _command_class(data: dict[Any, Any], catalog: KnownCommands) -> type[Command] | None:
    command_type = data.get("type")
    return catalog.public.get(command_type) if isinstance(command_type, str) else None


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
