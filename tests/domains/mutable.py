"""A domain module whose event is declared as a plain ``@dataclass`` (events are frozen): the import fails
inside the standard library, and the loader names this file's line, not the library's."""

from dataclasses import dataclass

from commitline import Domain, Event

domain = Domain("mutable")


@dataclass
class Counted(Event):
    n: int
