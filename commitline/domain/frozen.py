"""The read-only list and dict an event's payload holds in place of the ones it was given.

An event is a frozen dataclass, but freezing stops only the reassignment of its fields: a list in a payload can
still be appended to. An aggregate whose ``_evolve`` keeps an event's list (``self.items = event.items``) and
whose next event appends to it would change the first event before it is stored, so the store would hold a
history other than the one the command decided. ``frozen`` copies a payload's lists and dicts (nested ones too)
into ``FrozenList`` and ``FrozenDict``: they read, compare, copy and encode as the plain ones do, and any change
raises ``TypeError`` at the line that tries it.
"""

from __future__ import annotations

import typing
from collections.abc import Collection
from datetime import date, time, timedelta
from decimal import Decimal
from enum import Enum
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, NoReturn, Union, get_args, get_origin
from uuid import UUID

_ADVICE = "an event's payload never changes: copy it first (list(...) or dict(...)) and change the copy"


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(f"this {type(self).__name__[len('Frozen'):].lower()} belongs to an event: {_ADVICE}")


class FrozenList(list):  # type: ignore[type-arg]
    """A list that cannot change (``frozen`` makes them)."""

    __slots__ = ()
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[Any]]]:  # copy and pickle without ``extend``
        return FrozenList, (list(self),)

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


class FrozenDict(dict):  # type: ignore[type-arg]
    """A dict that cannot change (``frozen`` makes them)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[Any, Any]]]:
        return FrozenDict, (dict(self),)

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


def frozen(value: Any) -> Any:
    """``value`` with every plain list and dict in it (at any depth) copied into a frozen one; anything else as it is."""
    kind = type(value)
    if kind is list:
        return FrozenList([frozen(item) for item in value])
    if kind is dict:
        return FrozenDict({key: frozen(item) for key, item in value.items()})
    return value


#: Types whose values hold no list or dict (datetime is a date)
_SCALARS = (str, bytes, int, float, bool, UUID, Decimal, date, time, timedelta, Enum, type(None))


def may_hold_containers(cls: type, envelope: Collection[str]) -> bool:
    """Whether a field of ``cls`` (those named in ``envelope`` and class variables aside) may hold a list or a
    dict, by its annotation; True when an annotation cannot be read yet (a name defined later in its module)."""
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # a forward reference, say: it may
        return True
    return any(_may_hold(hint) for name, hint in hints.items()
               if name not in envelope and get_origin(hint) is not ClassVar)


def _may_hold(hint: Any) -> bool:
    origin = get_origin(hint)
    if origin is Annotated:
        return _may_hold(get_args(hint)[0])
    if origin is Union or origin is UnionType:
        return any(_may_hold(arg) for arg in get_args(hint))
    if origin is Literal:
        return False
    if origin is None and isinstance(hint, type):
        return not issubclass(hint, _SCALARS)
    supertype = getattr(hint, "__supertype__", None)  # a NewType
    return True if supertype is None else _may_hold(supertype)
