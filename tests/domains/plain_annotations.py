"""A domain module without ``from __future__ import annotations``: its aggregate's state field holds one enum
while its transition table moves between the members of another, and the check must see it all the same
(``test_domain_checks.py``)."""

from enum import Enum

from commitline import Aggregate, Domain, Event, transitions

domain = Domain("plain")


class Door(Enum):
    OPEN = "OPEN"
    SHUT = "SHUT"


class Lock(Enum):
    LOCKED = "LOCKED"
    UNLOCKED = "UNLOCKED"


class Opened(Event):
    by: str


@domain.aggregate
class Gate(Aggregate):
    state: Door | None = None

    EVENTS = (Opened,)
    TRANSITIONS = transitions({Lock.LOCKED: {Lock.UNLOCKED}, Lock.UNLOCKED: {Lock.LOCKED}})

    def _evolve(self, event: Event) -> None:
        self.state = Door.OPEN
