"""Release 1 again, with a field added to its event and no default, no new class_version, no upcaster: the
notes already stored do not fit it (``test_schema_evolution.py``). Everything else is release 1's."""

from __future__ import annotations

from commitline import Domain
from tests.domains.evolution import v1

domain = Domain("notes")


class NoteWritten(v1.NoteWritten):
    pinned: bool


@domain.aggregate
class Notebook(v1.Notebook):  # release 1's _evolve matches this NoteWritten too: it is one
    EVENTS = (NoteWritten,)


@domain.handles(v1.WriteNote, Notebook, v1.Stream.ANY, id="notebook_id")
def write_note(notebook: Notebook, command: v1.WriteNote) -> None:
    notebook._emit(NoteWritten, text=command.text, pinned=False)
