"""``v1_command_option`` with its optional field's default changed (``pinned`` now defaults to True): a request
sent again byte for byte is still the request it was (``test_schema_evolution.py``)."""

from __future__ import annotations

from commitline import Domain
from tests.domains.evolution import v1, v1_command_option

domain = Domain("notes")
domain.aggregate(v1.Notebook)


class WriteNote(v1_command_option.WriteNote):
    pinned: bool = True


domain.handles(WriteNote, v1.Notebook, v1.Stream.ANY, id="notebook_id")(v1_command_option.write_note)
