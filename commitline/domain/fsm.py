"""Finite-state machines as data: a transition table and the one check that enforces it.

A table is written as rows (``{CREATED: {PENDING}, PENDING: {COMPLETED, FAILED}, ...}``) with
``transitions(rows)``, or ``table(name, rows)`` to give the machine a name of its own in refusals
(each reservation of an inventory item, say). A table is not checked when it is made: ``problems()``
lists what is wrong with it, and a domain reports those of every table it holds at once, when it is
loaded (``commitline.framework.checks``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from commitline.domain.errors import IllegalTransition

S = TypeVar("S", bound=Enum)


@dataclass(frozen=True)
class TransitionTable(Generic[S]):
    """``allowed[state]`` is the set of states reachable from ``state`` in one step. ``aggregate`` names
    the machine in refusals; None: the aggregate's class name."""

    aggregate: str | None
    allowed: Mapping[S, frozenset[S]]

    def can(self, current: S, requested: S) -> bool:
        return requested in self.allowed.get(current, ())

    def check(self, current: S | None, requested: S, aggregate: str | None = None) -> None:
        """Raise IllegalTransition unless ``current`` may move to ``requested``. ``None`` is a
        machine that has not started (reported as NEW): it allows nothing."""
        name = self.aggregate or aggregate or "aggregate"
        if current is None:
            raise IllegalTransition(name, "NEW", requested.value, ())
        if not self.can(current, requested):
            raise IllegalTransition(name, current.value, requested.value,
                                    (s.value for s in self.allowed.get(current, ())))

    @property
    def states(self) -> tuple[S, ...]:
        return tuple(self.allowed)

    @property
    def enum(self) -> type[Enum] | None:
        """The enumeration the rows' states belong to (None when they are not all of one)."""
        kinds = {type(s) for s in self.allowed}
        return kinds.pop() if len(kinds) == 1 and issubclass(next(iter(kinds)), Enum) else None

    def problems(self) -> list[str]:
        """What makes this table unusable: states that are not members of one Enum, targets without a row,
        members of the Enum the table has no row for. Empty when it is sound."""
        found: list[str] = []
        everything: set[Any] = set(self.allowed).union(*self.allowed.values()) if self.allowed else set()
        if not self.allowed:
            return ["the transition table has no rows"]
        not_enum = sorted(repr(s) for s in everything if not isinstance(s, Enum))
        if not_enum:
            found.append(f"states must be members of an Enum, not {', '.join(not_enum)}")
        kinds = sorted({type(s).__name__ for s in everything if isinstance(s, Enum)})
        if len(kinds) > 1:
            found.append(f"states mix the enumerations {', '.join(kinds)}")
        unknown = sorted(_label(s) for s in set().union(*self.allowed.values()) - set(self.allowed))
        if unknown:
            found.append(f"targets {', '.join(unknown)} have no row of their own in the table")
        enum = self.enum
        if enum is not None and not not_enum and len(kinds) == 1:
            missing = sorted(m.name for m in enum if m not in self.allowed)
            if missing:
                found.append(f"{enum.__name__} members {', '.join(missing)} have no row (write `X: set()` for a "
                             "terminal state)")
        return found


def _label(state: Any) -> str:
    return state.name if isinstance(state, Enum) else repr(state)


def table(aggregate: str | None, rows: Mapping[S, set[S] | frozenset[S]]) -> TransitionTable[S]:
    """A transition table named ``aggregate`` in refusals (None: the aggregate's class name)."""
    return TransitionTable(aggregate, {state: frozenset(targets) for state, targets in rows.items()})


def transitions(rows: Mapping[S, set[S] | frozenset[S]]) -> TransitionTable[S]:
    """A transition table from its rows: each state and the states it may move to (``set()``: terminal)."""
    return table(None, rows)
