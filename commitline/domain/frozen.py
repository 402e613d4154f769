"""The read-only list and dict an event's payload holds in place of the ones it was given.

An event is a frozen dataclass, but freezing stops only the reassignment of its fields: a list in a payload can
still be appended to. An aggregate whose ``_evolve`` keeps an event's list (``self.items = event.items``) and
whose next event appends to it would change the first event before it is stored, so the store would hold a
history other than the one the command decided. ``frozen`` copies a payload's lists and dicts (nested ones too)
into ``FrozenList`` and ``FrozenDict``: they read, compare, copy and encode as the plain ones do, and any change
raises ``TypeError`` at the line that tries it.
"""

from __future__ import annotations

from typing import Any, NoReturn

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
