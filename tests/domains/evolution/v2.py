"""Release 2: a note has a title and a body. Version-1 notes are upcast: their first line is the title."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from commitline import Aggregate, Changes, Command, Domain, Event, Id, Projection, RecordedEvent, Stream, Table, Text, on

domain = Domain("notes")


class NoteWritten(Event):
    title: str
    body: str
    class_version = 2

    @staticmethod
    def upcast_v1_v2(data: dict[str, Any]) -> dict[str, Any]:
        title, _, body = data["text"].partition("\n")
        return {"title": title, "body": body}


@domain.aggregate
class Notebook(Aggregate):
    titles: list[str] = field(default_factory=list)

    EVENTS = (NoteWritten,)

    def _evolve(self, event: Event) -> None:
        match event:
            case NoteWritten(title=title):
                self.titles = [*self.titles, title]


class WriteNote(Command):
    notebook_id: Id
    title: Text
    body: str = ""


@domain.handles(WriteNote, Notebook, Stream.ANY, id="notebook_id")
def write_note(notebook: Notebook, command: WriteNote) -> None:
    notebook._emit(NoteWritten, title=command.title, body=command.body)


@domain.read_model
class Titles(Projection):
    name = "titles"
    tables = (Table("rm_titles", {"notebook_id": "uuid", "version": "bigint", "title": "text"},
                    key=("notebook_id", "version")),)

    @on(NoteWritten)
    def written(self, changes: Changes, r: RecordedEvent) -> None:
        changes.put("rm_titles", (r.event.aggregate_id, r.event.version), title=r.event.title)
