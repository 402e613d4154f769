"""Decimal event fields never take a binary float: an event emitted with one is refused, naming the field; and
which fields JSON stores as numbers or booleans (``scalar_fields``), so that a decoder can tell one whose type
changed from Decimal (stored as text).

An event is stored as JSON: a float given for a field declared ``Decimal`` (``price=float(p) * 3``) would be
stored as its binary approximation (``0.30000000000000004``) and read back as that decimal for good, which no
validation downstream could notice. The check costs an emission nothing for classes without such a field.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from decimal import Decimal
from types import UnionType
from typing import Any, ClassVar, Union, get_args, get_origin


@functools.cache
def decimal_fields(cls: type, envelope: frozenset[str]) -> tuple[str, ...]:
    """The fields of ``cls`` (those in ``envelope`` and class variables aside) whose annotation holds ``Decimal``:
    alone, optional, or the items of a collection. None when an annotation cannot be read (a name defined later
    in its module): such a class is not checked."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        return ()
    return tuple(name for name, hint in hints.items()
                 if name not in envelope and get_origin(hint) is not ClassVar and _holds_decimal(hint))


def _holds_decimal(hint: Any) -> bool:
    supertype = getattr(hint, "__supertype__", None)  # a NewType
    if supertype is not None:
        return _holds_decimal(supertype)
    return hint is Decimal or any(_holds_decimal(arg) for arg in get_args(hint))


def refuse_floats(cls: type, payload: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    """TypeError naming the first decimal field of ``payload`` given a binary float (in it or among its items)."""
    for name in fields:
        value = payload.get(name)
        if _float_in(value):
            raise TypeError(
                f"{cls.__qualname__}.{name} is a Decimal field, emitted with the binary float {value!r}: it would be "
                f"stored as that float's digits, which no decimal arithmetic gave. Emit a Decimal (computed from "
                f"Decimals, or Decimal(str(x)) where a float cannot be avoided)")


def _float_in(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_float_in(item) for item in value)
    if isinstance(value, Mapping):
        return any(_float_in(item) for item in value.values())
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
