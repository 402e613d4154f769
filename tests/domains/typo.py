"""A domain whose read model declares column types PostgreSQL does not know (``bigintt``, and ``numeric(12,2``, which
before PostgreSQL 16 does not even parse): sound as declared,
refused when it meets a database, before anything is created (``test_choosing_a_domain.py``)."""

from __future__ import annotations

from commitline import Changes, Domain, Projection, RecordedEvent, Table, on
from tests.domains import quiet

domain = Domain("typo").include(quiet.domain)


@domain.read_model
class Switches(Projection):
    name = "switches"
    tables = (Table("rm_switches", {"lamp_id": "uuid", "n": "bigintt", "price": "numeric(12,2"}, key=("lamp_id",), counters=("n",)),)

    @on(quiet.LampSwitched)
    def switched(self, changes: Changes, r: RecordedEvent) -> None:
        changes.add("rm_switches", (r.event.aggregate_id,), n=1)
