"""Release 3, shipped without the way from version 1: only ``upcast_v2_v3`` (a chain without a hole, but a
store holding version-1 notes cannot be read by it)."""

from __future__ import annotations

from typing import Any

from commitline import Aggregate, Domain, Event

domain = Domain("notes")


class NoteWritten(Event):
    title: str
    body: str
    tags: tuple[str, ...]
    class_version = 3

    @staticmethod
    def upcast_v2_v3(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "tags": ()}


@domain.aggregate
class Notebook(Aggregate):
    EVENTS = (NoteWritten,)

    def _evolve(self, event: Event) -> None:
        pass
