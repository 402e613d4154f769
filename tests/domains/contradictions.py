"""A domain whose declarations contradict each other in every way a loaded domain is checked for; each
contradiction is marked with the name its test looks for (``# <- name``)."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from commitline import Aggregate, Changes, Command, Domain, DomainError, Event, Id, Projection, RecordedEvent, Stream
from commitline import Table, on, transitions

domain = Domain("contradictions")


class Light(str, Enum):
    RED = "RED"
    GREEN = "GREEN"


class Switched(Event):
    to: str


class Renamed(Event):  # <- upcaster hole
    name: str
    class_version = 3

    @staticmethod
    def upcast_v1_v2(data: dict) -> dict:
        return {**data, "name": data.get("title", "")}


@domain.aggregate
class Lamp(Aggregate):
    state: Light | None = None
    EVENTS = (Switched, Renamed)
    TRANSITIONS = transitions({Light.RED: {Light.GREEN, "AMBER"}})  # <- unknown state

    def _evolve(self, event: Event) -> None:
        pass


class Switched2(Event):  # <- event type twice
    to: str


Switched2.__name__ = "Switched"


@domain.aggregate
class Socket(Aggregate):
    EVENTS = (Switched2,)

    def _evolve(self, event: Event) -> None:
        pass


class Unheld(Aggregate):
    EVENTS = (Switched,)


class SwitchLamp(Command):
    lamp_id: Id


class SwitchSocket(Command):
    type: Literal["switch_lamp"] = "switch_lamp"
    socket_id: Id


class Glow(Command):
    lamp_id: Id


@domain.handles(SwitchLamp, Lamp, id="lamp_id")
def switch_lamp(lamp: Lamp, command: SwitchLamp) -> None:
    pass


@domain.handles(SwitchSocket, Socket, id="socket_id")  # <- command type twice
def switch_socket(socket: Socket, command: SwitchSocket) -> None:
    pass


@domain.handles(Glow, Unheld, Stream.ANY, id="lamp_id")  # <- aggregate not held
def glow(lamp: Unheld, command: Glow) -> None:
    pass


class Dimmed(Event):
    level: int


@domain.read_model
class Brightness(Projection):  # <- event no aggregate emits
    name = "brightness"
    tables = (Table("rm_brightness", {"lamp_id": "uuid", "level": "bigint"}, key=("lamp_id",)),)

    @on(Dimmed)
    def dimmed(self, changes: Changes, r: RecordedEvent) -> None:
        pass


@domain.read_model
class Glows(Projection):  # <- table of unknown columns
    name = "glows"
    tables = (Table("rm_glows", {"lamp_id": "uuid", "n": "bigint"}, key=("lamp_id", "lamp"),
                    counters=("nn", "lamp_id")),)


@domain.error
class Broken(DomainError):  # <- error without status
    code = "broken_lamp"
