"""Release 1: a notebook's notes, each one text."""

from __future__ import annotations

from dataclasses import field

from commitline import Aggregate, Changes, Command, Domain, Event, Id, Projection, RecordedEvent, Stream, Table, Text, on

domain = Domain("notes")


class NoteWritten(Event):
    text: str


@domain.aggregate
class Notebook(Aggregate):
    notes: list[str] = field(default_factory=list)

    EVENTS = (NoteWritten,)

    def _evolve(self, event: Event) -> None:
        match event:
            case NoteWritten(text=text):
                self.notes = [*self.notes, text]


class WriteNote(Command):
    notebook_id: Id
    text: Text


@domain.handles(WriteNote, Notebook, Stream.ANY, id="notebook_id")
def write_note(notebook: Notebook, command: WriteNote) -> None:
    notebook._emit(NoteWritten, text=command.text)


@domain.read_model
class Titles(Projection):
    name = "titles"
    tables = (Table("rm_titles", {"notebook_id": "uuid", "version": "bigint", "title": "text"},
                    key=("notebook_id", "version")),)

    @on(NoteWritten)
    def written(self, changes: Changes, r: RecordedEvent) -> None:
        changes.put("rm_titles", (r.event.aggregate_id, r.event.version), title=r.event.text.split("\n")[0])
