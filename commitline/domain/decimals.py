"""The numbers an event is emitted with are stored exactly, or the event is refused naming the field: a Decimal
field never takes a binary float, at any depth (in its items, in a dataclass it holds); no float or Decimal is
NaN or infinite. Also which fields JSON stores as numbers or booleans (``scalar_fields``), so that a decoder can
tell one whose type changed from Decimal (stored as text).

An event is stored as JSON: a float given for a field declared ``Decimal`` (``price=float(p) * 3``) would be
stored as its binary approximation (``0.30000000000000004``) and read back as that decimal for good, which no
validation downstream could notice; a NaN or an infinity has no JSON form at all (the encoder writes ``null``),
so the stream could never be read back. Events are immutable: the refusal must come before anything is stored.
The check costs an emission nothing for classes whose fields can hold neither a float nor a Decimal.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping
from decimal import Decimal
from types import UnionType
from typing import Any, ClassVar, Union, get_args, get_origin


@functools.cache
def number_fields(cls: type, envelope: frozenset[str]) -> tuple[tuple[str, Any], ...]:
    """(name, annotation) of the fields of ``cls`` (those in ``envelope`` and class variables aside) whose values
    may hold a float or a Decimal: declared one, optional, the items of a collection, in a dataclass, or ``Any``.
    Empty when an annotation cannot be read (a name defined later in its module): such a class is not checked."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        return ()
    return tuple((name, hint) for name, hint in hints.items()
                 if name not in envelope and get_origin(hint) is not ClassVar and _may_hold_number(hint, set()))


def _may_hold_number(hint: Any, seen: set[type]) -> bool:
    hint = _plain(hint)
    if hint in (float, Decimal, Any, object) or isinstance(hint, typing.TypeVar):
        return True
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint in seen:
            return False
        seen.add(hint)
        try:
            nested = typing.get_type_hints(hint)
        except Exception:
            return True  # unreadable: checked at emission
        return any(_may_hold_number(h, seen) for h in nested.values())
    return any(_may_hold_number(arg, seen) for arg in get_args(hint) if arg is not Ellipsis)


def _plain(hint: Any) -> Any:
    while (supertype := getattr(hint, "__supertype__", None)) is not None:  # a NewType
        hint = supertype
    return hint


def refuse_inexact(cls: type, payload: Mapping[str, Any], fields: tuple[tuple[str, Any], ...]) -> None:
    """TypeError naming the first field of ``payload`` (among ``fields``, as ``number_fields`` gives them) holding a
    binary float where a Decimal is declared; ValueError naming the first holding a number (float or Decimal) that is
    NaN or infinite."""
    for name, hint in fields:
        found = _inexact(payload.get(name), hint, name)
        if found is None:
            continue
        path, value, decimal = found
        if decimal:
            raise TypeError(
                f"{cls.__qualname__}.{path} is a Decimal field, emitted with the binary float {value!r}: it would be "
                f"stored as that float's digits, which no decimal arithmetic gave. Emit a Decimal (computed from "
                f"Decimals, or Decimal(str(x)) where a float cannot be avoided)")
        raise ValueError(
            f"{cls.__qualname__}.{path} was emitted with {value!r}, which is not a finite number: the store could not "
            f"read it back (JSON has no NaN or infinity), so the stream would be unreadable for good. Emit a finite "
            f"number, or model the case another way (None, say)")


def _inexact(value: Any, hint: Any, path: str) -> tuple[str, float | Decimal, bool] | None:
    """(path, value, whether a Decimal was declared there) of the first number in ``value`` that would not be
    stored exactly (a float where ``hint`` declares a Decimal; a NaN or an infinity); None when there is none."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return path, value, False
        return (path, value, True) if _decimal_only(hint) else None
    if isinstance(value, Decimal):
        return None if value.is_finite() else (path, value, False)
    if value is None or isinstance(value, (str, int)):
        return None
    hint = _plain(hint)
    origin = get_origin(hint)
    if origin is Union or isinstance(hint, UnionType):
        decimal = _decimal_only(hint)
        arms = [Decimal] if decimal else [
            arm for arm in map(_plain, get_args(hint))
            if isinstance(kind := get_origin(arm) or arm, type) and isinstance(value, kind)]
        hint = arms[0] if len(arms) == 1 else (Decimal if decimal else Any)
        origin = get_origin(hint)
    if isinstance(value, Mapping):
        args = get_args(hint)
        item = args[1] if origin is not None and len(args) == 2 else (Decimal if hint is Decimal else Any)
        for v in value.values():
            if (found := _inexact(v, item, path)) is not None:
                return found
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        args = [a for a in get_args(hint) if a is not Ellipsis]
        positional = origin is tuple and len(args) > 1 and Ellipsis not in get_args(hint)
        for i, v in enumerate(value):
            item = (args[i] if i < len(args) else Any) if positional else (
                args[0] if args else (Decimal if hint is Decimal else Any))
            if (found := _inexact(v, item, path)) is not None:
                return found
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            nested = typing.get_type_hints(type(value))
        except Exception:
            nested = {}
        for f in dataclasses.fields(value):
            if (found := _inexact(getattr(value, f.name), nested.get(f.name, Any), f"{path}.{f.name}")) is not None:
                return found
    return None


def _decimal_only(hint: Any) -> bool:
    """Whether ``hint`` declares a Decimal where a float is not also allowed."""
    hint = _plain(hint)
    if hint is Decimal:
        return True
    if get_origin(hint) is Union or isinstance(hint, UnionType):
        arms = {_plain(arm) for arm in get_args(hint)}
        return Decimal in arms and not arms & {float, Any, object}
    return False


_SCALARS = {int: "int", float: "float", bool: "bool"}


@functools.cache
def scalar_fields(cls: type, envelope: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """(name, type name) of each field of ``cls`` declared ``int``, ``float`` or ``bool``, or one of them or None
    (``envelope`` and class variables aside): JSON holds their values as numbers or booleans, never as text."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        return ()
    found = []
    for name, hint in hints.items():
        if name in envelope or get_origin(hint) is ClassVar:
            continue
        kinds = [arg for arg in (get_args(hint) if isinstance(hint, UnionType) or get_origin(hint) is Union
                                 else (hint,)) if arg is not type(None)]
        if kinds and all(kind in _SCALARS for kind in kinds):
            found.append((name, " or ".join(_SCALARS[kind] for kind in kinds)))
    return tuple(found)
