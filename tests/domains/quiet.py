"""A domain whose command may change nothing: switching a lamp to the state it is already in decides no events.
Used by the tests of commands that record only their key (``test_commands_that_change_nothing.py``)."""

from __future__ import annotations

from commitline import Aggregate, Command, Domain, Event, Id, Stream

domain = Domain("quiet")


class LampSwitched(Event):
    on: bool


@domain.aggregate
class Lamp(Aggregate):
    on: bool = False

    EVENTS = (LampSwitched,)

    def switch(self, on: bool) -> None:
        if on != self.on:  # already so: nothing to record
            self._emit(LampSwitched, on=on)

    def _evolve(self, event: Event) -> None:
        match event:
            case LampSwitched(on=on):
                self.on = on


class Switch(Command):
    lamp_id: Id
    on: bool


@domain.handles(Switch, Lamp, Stream.ANY, id="lamp_id")
def switch(lamp: Lamp, cmd: Switch) -> None:
    lamp.switch(cmd.on)
