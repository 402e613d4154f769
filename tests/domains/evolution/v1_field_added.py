"""Release 1 again, with a field added to its event and no default, no new class_version, no upcaster: the
notes already stored do not fit it (``test_schema_evolution.py``)."""

from __future__ import annotations

from dataclasses import field

from commitline import Aggregate, Command, Domain, Event, Id, Stream, Text

domain = Domain("notes")


class NoteWritten(Event):
    text: str
    pinned: bool


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
    notebook._emit(NoteWritten, text=command.text, pinned=False)
