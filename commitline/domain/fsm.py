"""Finite-state machines as data: a transition table and the one check that enforces it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from commitline.domain.errors import IllegalTransition

S = TypeVar("S", bound=Enum)


@dataclass(frozen=True)
class TransitionTable(Generic[S]):
    """``allowed[state]`` is the set of states reachable from ``state`` in one step."""

    aggregate: str
    allowed: Mapping[S, frozenset[S]]

    def __post_init__(self) -> None:
        states = set(self.allowed)
        targets = set().union(*self.allowed.values())
        if not targets <= states:
            raise ValueError(f"{self.aggregate}: targets {targets - states} have no row in the table")

    def can(self, current: S, requested: S) -> bool:
        return requested in self.allowed[current]

    def check(self, current: S | None, requested: S) -> None:
        """Raise IllegalTransition unless ``current`` may move to ``requested``. ``None`` is a
        machine that has not started (reported as NEW): it allows nothing."""
        if current is None:
            raise IllegalTransition(self.aggregate, "NEW", requested.value, ())
        if not self.can(current, requested):
            raise IllegalTransition(
                self.aggregate,
                current.value,
                requested.value,
                (s.value for s in self.allowed[current]),
            )

    @property
    def states(self) -> tuple[S, ...]:
        return tuple(self.allowed)


def table(aggregate: str, rows: Mapping[S, set[S]]) -> TransitionTable[S]:
    return TransitionTable(aggregate, {state: frozenset(targets) for state, targets in rows.items()})
