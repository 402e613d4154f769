"""A domain whose events hold dicts keyed by something other than strings, which JSON cannot store: refused
when the domain is loaded, naming each event and field (``test_domain_checks.py``)."""

from __future__ import annotations

from enum import Enum
from typing import Literal
from uuid import UUID

from commitline import Aggregate, Domain, Event

domain = Domain("keyed")


class Level(Enum):
    LOW = 1
    HIGH = 2


class Measured(Event):
    by_level: dict[Level, int]
    by_name: dict[str, int]
    by_side: dict[Literal["left", "right"], int]
    history: list[dict[UUID, int]]


@domain.aggregate
class Meter(Aggregate):
    EVENTS = (Measured,)

    def _evolve(self, event: Event) -> None:
        pass
