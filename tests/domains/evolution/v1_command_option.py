"""Release 1 again, whose ``write_note`` command gained an optional field (``pinned``, default False) and whose
events are unchanged: requests sent to release 1 are the same requests to this one (``test_schema_evolution.py``)."""

from __future__ import annotations

from commitline import Command, Domain, Id, Text
from tests.domains.evolution import v1

domain = Domain("notes")
domain.aggregate(v1.Notebook)


class WriteNote(Command):
    notebook_id: Id
    text: Text
    pinned: bool = False


@domain.handles(WriteNote, v1.Notebook, v1.Stream.ANY, id="notebook_id")
def write_note(notebook: v1.Notebook, command: WriteNote) -> None:
    notebook._emit(v1.NoteWritten, text=command.text)
