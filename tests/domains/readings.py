"""A domain whose events can be given values their JSON cannot hold: a float from a command (NaN, given in
Python), and a handler that, for a reading of -1, puts bytes into a field typed ``Any``, and for -2 scales the
reading beyond 64 bits. Used by tests/integration/test_unstorable_values.py: each is refused before anything is written."""

from __future__ import annotations

from typing import Any

from commitline import Aggregate, Command, Domain, Event, Id, Stream

domain = Domain("readings")


class Read(Event):
    value: int
    ratio: float
    extra: dict[str, Any]


@domain.aggregate
class Meter(Aggregate):
    total: int = 0
    readings: int = 0

    EVENTS = (Read,)

    def _evolve(self, event: Event) -> None:
        match event:
            case Read(value=value):
                self.total += value
                self.readings += 1


class Record(Command):
    meter_id: Id
    value: int
    ratio: float = 0.0


@domain.handles(Record, Meter, Stream.ANY, id="meter_id")
def record(meter: Meter, cmd: Record) -> None:
    extra: dict[str, Any] = {"raw": b"\x00"} if cmd.value == -1 else {"note": "ok"}
    meter._emit(Read, value=cmd.value * 2 ** 70 if cmd.value == -2 else cmd.value, ratio=cmd.ratio, extra=extra)
