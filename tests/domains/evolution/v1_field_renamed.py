"""Release 1 again, with its event's ``text`` renamed ``body`` and given a default, no new class_version, no
upcaster: read as they are, the notes already stored would come back empty (``test_schema_evolution.py``)."""

from __future__ import annotations

from commitline import Domain, Event
from tests.domains.evolution import v1

domain = Domain("notes")


class NoteWritten(Event):
    body: str = ""


@domain.aggregate
class Notebook(v1.Notebook):
    EVENTS = (NoteWritten,)

    def _evolve(self, event: Event) -> None:
        match event:
            case NoteWritten(body=body):
                self.notes = [*self.notes, body]


@domain.handles(v1.WriteNote, Notebook, v1.Stream.ANY, id="notebook_id")
def write_note(notebook: Notebook, command: v1.WriteNote) -> None:
    notebook._emit(NoteWritten, body=command.text)
