"""A domain whose aggregate holds a field that JSON cannot carry back: a dict keyed by an enum of integers. Its
snapshot is written as ``{"1": 3}`` and that key does not decode as ``Level.LOW`` again. Used by the tests of
snapshots a store does not use (``test_store_guarantees.py``)."""

from __future__ import annotations

from dataclasses import field
from enum import Enum

from commitline import Aggregate, Command, Domain, Event, Id, Stream

domain = Domain("levels")


class Level(Enum):
    LOW = 1
    HIGH = 2


class LevelReached(Event):
    level: int


@domain.aggregate
class Gauge(Aggregate):
    by_level: dict[Level, int] = field(default_factory=dict)

    EVENTS = (LevelReached,)

    def _evolve(self, event: Event) -> None:
        match event:
            case LevelReached(level=level):
                self.by_level = {**self.by_level, Level(level): self.by_level.get(Level(level), 0) + 1}


class Reach(Command):
    gauge_id: Id
    level: int


@domain.handles(Reach, Gauge, Stream.ANY, id="gauge_id")
def reach(gauge: Gauge, cmd: Reach) -> None:
    gauge._emit(LevelReached, level=cmd.level)
