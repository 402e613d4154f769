"""Money in commands never passes through a binary float: ``Amount``, and every field declared ``Decimal``.

``Amount`` checks itself (a decimal string or an integer, never a float, wherever it is declared). A field
declared plain ``Decimal`` has no such check of its own, and pydantic's JSON mode would take ``0.1`` there with
its binary digits, ``1.0000000000000000001`` as 1, and ``"1e3"`` or ``"1_000"`` as text. ``float_decimals``
finds every such float, and every decimal string an ``Amount`` would refuse, in a command's JSON, guided by the
command's annotations: its own fields, the items of its lists, tuples, sets and mappings, and the fields of the
models it holds (at any depth, a model holding itself included), so that ``parse_command``
refuses each one, naming where. ``decimal_properties`` tells the OpenAPI description which properties of which
models to offer integers or strings only.

A union is checked against each of its members: a float where any member would read a plain ``Decimal`` is
refused (``Decimal | float`` too: whoever wants floats there declares ``float``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, Field

from commitline.application.boundary import problem

DECIMAL_TEXT = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?$"
"""How an amount is written as a JSON string: digits, an optional point and decimals (``12.50``, ``-3``, ``0.5``);
no exponent, no leading zeros, no white space. The OpenAPI description says exactly this."""
_DECIMAL_TEXT = re.compile(DECIMAL_TEXT)

FLOAT_DECIMAL = ("a decimal is given as a string such as \"12.50\" or an integer, never a binary float (a JSON "
                 "number with a fraction or an exponent), which cannot hold every decimal exactly")
TEXT_DECIMAL = ("a decimal string is digits with an optional point and decimals, such as \"12.50\": no exponent, "
                "white space, underscores or leading zeros")


def _decimal_only(value: Any) -> Any:
    if isinstance(value, float):
        raise ValueError("amounts must be given as a decimal string or an integer, never a binary float")
    if isinstance(value, bool):
        raise ValueError("an amount is a decimal string or an integer, not a boolean")
    if isinstance(value, str) and not _DECIMAL_TEXT.fullmatch(value):  # not match: "$" passes a final newline
        raise ValueError('an amount is written as digits with an optional point and decimals, e.g. "12.50"')
    return value


_BOUNDS = ("gt", "ge", "lt", "le", "decimal_places", "max_digits", "multiple_of")


@dataclass(frozen=True)  # hashable and equal to itself, as pydantic's annotations are
class _AmountJsonSchema:
    """An ``Amount``'s JSON schema: an integer, or a string written as ``DECIMAL_TEXT``; with the bounds a field
    puts on it (``Annotated[Amount, Field(gt=0, le=..., decimal_places=2)]``) written in as far as JSON Schema
    can say them: the integer's minimum and maximum, the string's sign and decimal places, all in the
    description. (pydantic's own ``WithJsonSchema`` would replace them all by one fixed schema.)"""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        return amount_json_schema(_bounds(core_schema))


def _bounds(schema: Any) -> dict[str, Any]:
    """The constraints on a decimal's core schema: its own keys, and those of the validators pydantic wraps it in
    (a constraint on an annotated type whose validator runs first becomes a function after it)."""
    found: dict[str, Any] = {}
    while isinstance(schema, dict):
        for key in _BOUNDS:
            if key in schema:
                found.setdefault(key, schema[key])
        function = schema.get("function")
        keywords = getattr(function.get("function"), "keywords", None) if isinstance(function, dict) else None
        for key, value in (keywords or {}).items():
            if key in _BOUNDS:
                found.setdefault(key, value)
        schema = schema.get("schema")
    return found


def amount_json_schema(bounds: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema of an ``Amount`` with ``bounds`` (pydantic's names: gt, ge, lt, le, decimal_places,
    max_digits, multiple_of)."""
    integer: dict[str, Any] = {"type": "integer"}
    words = []
    for key, json_key, word in (("gt", "exclusiveMinimum", "above"), ("ge", "minimum", "at least"),
                                ("lt", "exclusiveMaximum", "below"), ("le", "maximum", "at most")):
        if key in bounds:
            value = Decimal(bounds[key])
            integer[json_key] = int(value) if value == value.to_integral_value() else float(value)
            words.append(f"{word} {format(value, 'f')}")
    if "multiple_of" in bounds:
        step = Decimal(bounds["multiple_of"])
        integer["multipleOf"] = int(step) if step == step.to_integral_value() else float(step)
        words.append(f"a multiple of {format(step, 'f')}")
    places = bounds.get("decimal_places")
    if places is not None:
        words.append(f"at most {places} decimal places")
    if bounds.get("max_digits") is not None:
        words.append(f"at most {bounds['max_digits']} digits")
    fraction = r"(\.[0-9]+)?" if places is None else r"(\.0+)?" if places == 0 else rf"(\.[0-9]{{1,{places}}}0*)?"
    lower = Decimal(bounds["gt"]) if "gt" in bounds else None
    at_least = Decimal(bounds["ge"]) if "ge" in bounds else None
    if lower == 0:  # above zero: no sign, and not zero itself
        small = (None if places == 0 else r"0\.[0-9]*[1-9][0-9]*" if places is None
                 else rf"0\.[0-9]{{0,{places - 1}}}[1-9]0*")
        pattern = rf"^([1-9][0-9]*{fraction}" + (f"|{small}" if small else "") + ")$"
    elif (lower is not None and lower > 0) or (at_least is not None and at_least >= 0):
        pattern = rf"^(0|[1-9][0-9]*){fraction}$"
    else:
        pattern = rf"^-?(0|[1-9][0-9]*){fraction}$"
    description = 'a decimal: a string such as "12.50", or an integer' + (f"; {', '.join(words)}" if words else "")
    return {"anyOf": [integer, {"type": "string", "pattern": pattern}], "description": description}


# pydantic refuses NaN and infinities in a Decimal by default; its allow_inf_nan=False would check through a float,
# refusing 10^309 and beyond as "not finite".
Amount = Annotated[Decimal, BeforeValidator(_decimal_only), Field(strict=False), _AmountJsonSchema()]
"""a decimal given as a string (``12.50``) or an integer, never a binary float"""


def _is_amount(metadata: Iterable[Any]) -> bool:
    return any(getattr(m, "func", None) is _decimal_only for m in metadata)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _base(annotation: Any) -> Any:
    """``annotation`` through a NewType; None for an ``Amount`` (it checks itself)."""
    while True:
        if get_origin(annotation) is Annotated:
            base, *metadata = get_args(annotation)
            if _is_amount(metadata):
                return None
            annotation = base
        elif (supertype := getattr(annotation, "__supertype__", None)) is not None:
            annotation = supertype
        else:
            return annotation


def _holds(annotation: Any, models: bool, seen: frozenset[type] = frozenset()) -> bool:
    """Whether a value of ``annotation`` may hold a plain ``Decimal``: itself, among its items, or (``models``)
    among the fields of a model it holds."""
    annotation = _base(annotation)
    if annotation is None:
        return False
    if annotation is Decimal:
        return True
    if _is_model(annotation):
        if annotation in seen:  # a model holding itself: walked if it holds a Decimal elsewhere, which it may
            return models
        return models and any(_holds(info.annotation, True, seen | {annotation}) for _, info in _fields(annotation))
    return any(_holds(arg, models, seen) for arg in get_args(annotation))


def _fields(model: type[BaseModel]) -> Iterator[tuple[str, Any]]:
    """(name in JSON, field info) of each field of ``model`` that is not an ``Amount``."""
    for name, info in model.model_fields.items():
        if not _is_amount(info.metadata):
            yield info.alias or name, info


@cache
def _guided(model: type[BaseModel]) -> tuple[tuple[str, Any], ...]:
    """(name in JSON, annotation) of the fields of ``model`` whose values may hold a plain ``Decimal``."""
    return tuple((key, info.annotation) for key, info in _fields(model)
                 if _holds(info.annotation, True, frozenset({model})))


def float_decimals(model: type[BaseModel], data: Mapping[Any, Any]) -> list[dict[str, Any]]:
    """A problem at each place of ``data`` (a command's JSON) where a plain ``Decimal`` was given a binary float
    (``decimal_type``) or a string that is not ``DECIMAL_TEXT`` (``decimal_parsing``: pydantic would read
    ``"1e3"``, ``" 2.5 "`` or ``"1_000"``), in field order."""
    found: dict[tuple[str | int, ...], dict[str, Any]] = {}
    texts: set[tuple[str | int, ...]] = set()

    def walk(value: Any, annotation: Any, loc: tuple[str | int, ...]) -> None:
        annotation = _base(annotation)
        if annotation is None:
            return
        if annotation is Decimal:
            if loc in found:
                return
            if isinstance(value, float):
                found[loc] = problem(list(loc), FLOAT_DECIMAL, "decimal_type")
            elif isinstance(value, str) and loc not in texts and not _DECIMAL_TEXT.fullmatch(value):
                found[loc] = problem(list(loc), TEXT_DECIMAL, "decimal_parsing")
            return
        if _is_model(annotation):
            if isinstance(value, Mapping):
                for key, field in _guided(annotation):
                    if key in value:
                        walk(value[key], field, (*loc, key))
            return
        origin, args = get_origin(annotation), get_args(annotation)
        if origin is Union or origin is UnionType:
            if isinstance(value, str) and any(_base(arg) is str for arg in args):
                texts.add(loc)  # a member takes any text: a string there is no malformed decimal
            for arg in args:
                walk(value, arg, loc)
        elif isinstance(value, (list, tuple)) and args:
            positional = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
            for index, item in enumerate(value):
                if not positional:
                    walk(item, args[0], (*loc, index))
                elif index < len(args):
                    walk(item, args[index], (*loc, index))
        elif isinstance(value, Mapping) and args:
            for key, item in value.items():
                walk(item, args[-1], (*loc, str(key)))

    walk(data, model, ())
    return list(found.values())


@cache
def may_take_float_decimals(model: type[BaseModel]) -> bool:
    """Whether ``float_decimals`` can find anything in a ``model``'s JSON (most commands: not worth a walk)."""
    return bool(_guided(model))


def decimal_properties(models: Iterable[type[BaseModel]]) -> dict[type[BaseModel], tuple[str, ...]]:
    """Each model among ``models`` and the models their fields hold (at any depth), with the properties whose
    own schema may hold a plain ``Decimal`` (those holding one only through another model are left to that
    model's entry)."""
    found: dict[type[BaseModel], tuple[str, ...]] = {}

    def visit(model: type[BaseModel]) -> None:
        if model in found:  # visited, or being visited (a model holding itself)
            return
        found[model] = tuple(key for key, info in _fields(model) if _holds(info.annotation, False))
        for _, info in _fields(model):
            for nested in _models_in(info.annotation):
                visit(nested)

    for model in models:
        visit(model)
    return {model: keys for model, keys in found.items() if keys}


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    annotation = _base(annotation)
    if annotation is None:
        return
    if _is_model(annotation):
        yield annotation
        return
    for arg in get_args(annotation):
        yield from _models_in(arg)
