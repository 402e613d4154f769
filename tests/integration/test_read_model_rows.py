"""What a read-model handler reads with ``changes.get`` is the row the database holds once the batch is written:
every column (key, values, counters' totals), whether the row was written in an earlier batch, is pending in
this one, or both. So a handler behaves the same however the events fell into batches (live batches are small,
a rebuild's large), and a row read can be put back changed (``put(**{**row, "state": ...})``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import pytest

from commitline import Changes, Table
from commitline.projections import storage
from commitline.projections.storage import load_rows, write_changes

pytestmark = pytest.mark.integration

TABLE = Table("rm_orders", {"order_id": "uuid", "tenant": "text", "state": "text", "note": "text",
                            "fills": "bigint", "filled": "numeric"}, key=("order_id", "tenant"),
              counters=("fills", "filled"))
ORDER = UUID("00000000-0000-4000-8000-0000000000a1")
KEY = (ORDER, "acme")

# one order's changes, in the order its events would make them: (operation, columns)
STEPS: list[tuple[str, dict[str, Any]]] = [
    ("put", {"state": "NEW", "note": "limit 10.05"}),
    ("add", {"fills": 1, "filled": Decimal("2.5")}),
    ("put", {"state": "PARTIALLY_FILLED", "note": None}),  # None leaves the note as it is
    ("add", {"fills": 1, "filled": Decimal("7.5")}),
    ("roundtrip", {"state": "FILLED"}),  # read the row, put it back changed
]


def fresh(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    conn.execute(f'DROP TABLE IF EXISTS "{schema}".rm_orders')
    storage.create_tables(conn, schema, type("P", (), {"tables": (TABLE,)})())


def run(conn: psycopg.Connection[Any], schema: str, batches: list[list[tuple[str, dict[str, Any]]]]
        ) -> list[dict[str, Any] | None]:
    """Apply the steps batch by batch as the projector does (prefetch, handlers, write); what ``get`` said
    after each step, and after each batch the stored row, which must be what ``get`` said last."""
    seen: list[dict[str, Any] | None] = []
    for batch in batches:
        changes = Changes({TABLE.name: TABLE})
        changes.loaded[TABLE.name] = load_rows(conn, schema, TABLE, {KEY})
        for operation, columns in batch:
            if operation == "put":
                changes.put(TABLE.name, KEY, **columns)
            elif operation == "add":
                changes.add(TABLE.name, KEY, **columns)
            else:
                row = changes.get(TABLE.name, KEY)
                assert row is not None
                changes.put(TABLE.name, KEY, **{**row, **columns})
            seen.append(changes.get(TABLE.name, KEY))
        write_changes(conn, schema, changes)
        stored = load_rows(conn, schema, TABLE, {KEY}).get(KEY)
        assert stored == seen[-1], f"after the batch, get said {seen[-1]}, the table holds {stored}"
    return seen


@pytest.mark.parametrize("cuts", [(), (1,), (2,), (4,), (1, 2, 3, 4)], ids=lambda c: f"batches cut at {c}")
def test_a_handler_reads_the_same_row_however_the_events_fell_into_batches(pg_dsn: str, schema: str,
                                                                           cuts: tuple[int, ...]) -> None:
    bounds = [0, *cuts, len(STEPS)]
    batches = [STEPS[a:b] for a, b in zip(bounds, bounds[1:])]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        fresh(conn, schema)
        seen = run(conn, schema, batches)
    assert seen[0] == {"order_id": ORDER, "tenant": "acme", "state": "NEW", "note": "limit 10.05", "fills": 0,
                       "filled": 0}
    assert seen[2] == {"order_id": ORDER, "tenant": "acme", "state": "PARTIALLY_FILLED", "note": "limit 10.05",
                       "fills": 1, "filled": Decimal("2.5")}
    assert seen[-1] == {"order_id": ORDER, "tenant": "acme", "state": "FILLED", "note": "limit 10.05",
                        "fills": 2, "filled": Decimal("10.0")}


def test_put_names_a_key_column_or_counter_it_cannot_set_and_changes_nothing() -> None:
    changes = Changes({TABLE.name: TABLE})
    changes.add(TABLE.name, KEY, fills=1)
    for columns, named in [({"tenant": "other"}, "rm_orders.tenant is a key column"),
                           ({"fills": 5}, "rm_orders.fills is a counter"),
                           ({"colour": "red"}, "rm_orders.colour is not a column")]:
        with pytest.raises(AssertionError, match=named):
            changes.put(TABLE.name, KEY, state="X", **columns)
    assert changes.get(TABLE.name, KEY) == {"order_id": ORDER, "tenant": "acme", "state": None, "note": None,
                                            "fills": 1, "filled": 0}
