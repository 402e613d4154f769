"""A domain whose read model writes a value its column cannot hold: a note of digits goes into a ``bigint``
column, any other note fails there (``test_unwritable_rows.py``), as a team's mistaken column type would."""

from __future__ import annotations

from commitline import Aggregate, Changes, Command, Domain, Event, Id, Projection, RecordedEvent, Stream, Table, on

domain = Domain("unwritable")


class Noted(Event):
    note: str


@domain.aggregate
class Pad(Aggregate):
    notes: int = 0

    EVENTS = (Noted,)

    def note(self, text: str) -> None:
        self._emit(Noted, note=text)

    def _evolve(self, event: Event) -> None:
        self.notes += 1


class Note(Command):
    pad_id: Id
    note: str


@domain.handles(Note, Pad, Stream.ANY, id="pad_id")
def note(pad: Pad, cmd: Note) -> None:
    pad.note(cmd.note)


@domain.read_model
class Notes(Projection):
    name = "notes"
    tables = (Table("rm_notes", {"event": "uuid", "pad": "uuid", "number": "bigint"}, key=("event",)),)

    @on(Noted)
    def noted(self, changes: Changes, r: RecordedEvent) -> None:
        changes.put("rm_notes", (r.event.event_id,), pad=r.event.aggregate_id, number=r.event.note)  # the mistake


@domain.read_model
class Counts(Projection):
    """A sound read model beside it: it goes on whatever the other does."""

    name = "note_counts"
    tables = (Table("rm_note_counts", {"pad": "uuid", "notes": "bigint"}, key=("pad",), counters=("notes",)),)

    @on(Noted)
    def noted(self, changes: Changes, r: RecordedEvent) -> None:
        changes.add("rm_note_counts", (r.event.aggregate_id,), notes=1)
