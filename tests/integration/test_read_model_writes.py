"""A batch of read-model changes is written as one JSON document (``json_to_recordset``), and the rows it leaves
are exactly those the one-array-per-column upsert leaves, for every kind of value a handler writes: counters
added, values overwritten only when given, an erased value as the erased JSON or as no value, JSON columns
parsed. A batch holding a value JSON cannot carry exactly (an integer beyond 64 bits, a float or decimal that
is not finite, bytes) is written with arrays instead, and nothing of it is lost."""

from __future__ import annotations

import math
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.types.json import Jsonb

from commitline import ERASED, Changes, Table
from commitline.projections import storage
from commitline.projections.storage import _upsert_arrays, _upsert_json, write_changes

pytestmark = pytest.mark.integration

TABLE = Table("rm_kinds", {
    "id": "uuid", "tenant": "text", "n": "bigint", "total": "numeric", "label": "text", "doc": "jsonb",
    "raw": "json", "at": "timestamptz", "day": "date", "flag": "boolean", "ratio": "float8", "code": "varchar(8)",
    "big": "numeric", "blob": "bytea",
}, key=("id", "tenant"), counters=("n", "total"))

A, B = UUID("00000000-0000-4000-8000-00000000000a"), UUID("00000000-0000-4000-8000-00000000000b")


def changes(*batches: dict[tuple[Any, ...], dict[str, Any]]) -> list[Changes]:
    out = []
    for rows in batches:
        c = Changes({TABLE.name: TABLE})
        for key, row in rows.items():
            deltas = {k: v for k, v in row.items() if k in TABLE.counters}
            values = {k: v for k, v in row.items() if k not in TABLE.counters}
            if deltas:
                c.add(TABLE.name, key, **deltas)
            if values:
                c.put(TABLE.name, key, **values)
        out.append(c)
    return out


FIRST = {
    (A, "acme"): {"n": 1, "total": Decimal("12.50"), "label": 'quote " and \\ and é', "doc": '{"a": [1, 2]}',
                  "raw": '{"b": true}', "at": datetime(2026, 11, 28, 2, 30, 0, 123456, tzinfo=timezone.utc),
                  "day": date(2026, 11, 28), "flag": True, "ratio": 0.1, "code": "EUR"},
    (B, "acme"): {"n": 2, "label": ERASED, "doc": ERASED, "at": ERASED, "flag": False},
}
SECOND = {
    (A, "acme"): {"n": 5, "total": Decimal("-2.25"), "label": None, "doc": Jsonb({"c": None}), "ratio": 2.5e-300},
    (B, "other"): {"total": Decimal("0.000000000000000000001"), "code": "x"},
}


def written(conn: psycopg.Connection[Any], schema: str, upsert: Any, batches: list[Changes]) -> list[tuple[Any, ...]]:
    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    conn.execute(f'DROP TABLE IF EXISTS "{schema}".rm_kinds')
    storage.create_tables(conn, schema, type("P", (), {"tables": (TABLE,)})())
    for batch in batches:
        statement, params = upsert(schema, TABLE, batch.rows[TABLE.name], "")
        conn.execute(statement, params)
    return conn.execute(f'SELECT * FROM "{schema}".rm_kinds ORDER BY id, tenant').fetchall()


def test_json_rows_are_the_rows_arrays_write(pg_dsn: str, schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        as_json = written(conn, schema, _upsert_json, changes(FIRST, SECOND))
        as_arrays = written(conn, schema, _upsert_arrays, changes(FIRST, SECOND))
    assert as_json == as_arrays
    first = as_json[0]
    assert first[:4] == (A, "acme", 6, Decimal("10.25"))
    assert first[4] == 'quote " and \\ and é'  # a value set to None keeps what was there
    assert first[5] == {"c": None} and first[6] == {"b": True}
    assert first[7] == datetime(2026, 11, 28, 2, 30, 0, 123456, tzinfo=timezone.utc) and first[10] == 2.5e-300
    erased = as_json[1]
    assert erased[4] == '{"erased": true}' and erased[5] == {"erased": True} and erased[7] is None


@pytest.mark.parametrize("value", [2**70, math.nan, math.inf, Decimal("NaN"), b"\x00\xff"],
                         ids=["int-beyond-64-bits", "nan", "infinity", "decimal-nan", "bytes"])
def test_a_value_json_cannot_carry_exactly_goes_as_arrays(pg_dsn: str, schema: str, value: Any) -> None:
    column = {int: "big", float: "ratio", Decimal: "big", bytes: "blob"}[type(value)]
    rows = {(A, "acme"): {column: value, "code": "kept"}}
    batch = changes(rows)[0]
    with pytest.raises(storage._NotJson):
        _upsert_json(schema, TABLE, batch.rows[TABLE.name], "")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        written(conn, schema, _upsert_json, [])  # the table, empty
        write_changes(conn, schema, batch)
        stored, code = conn.execute(f'SELECT {column}, code FROM "{schema}".rm_kinds').fetchone()
    assert code == "kept"
    if isinstance(value, float) or (isinstance(value, Decimal) and value.is_nan()):
        assert (math.isnan(value) and math.isnan(stored)) or stored == value
    else:
        assert stored == value


def test_many_rows_in_one_batch(pg_dsn: str, schema: str) -> None:
    rows = {(uuid4(), f"t{i % 7}"): {"n": i, "total": Decimal(i) / 100, "label": f"row {i}"} for i in range(3_000)}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert written(conn, schema, _upsert_json, changes(rows)) == written(conn, schema, _upsert_arrays, changes(rows))
        assert conn.execute(f'SELECT count(*), sum(n) FROM "{schema}".rm_kinds').fetchone() == (3_000, sum(range(3_000)))


def test_rows_are_read_back_by_their_keys(pg_dsn: str, schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        written(conn, schema, _upsert_json, changes(FIRST, SECOND))
        found = storage.load_rows(conn, schema, TABLE, {(A, "acme"), (B, "other"), (B, "nobody")})
    assert set(found) == {(A, "acme"), (B, "other")}
    assert found[(A, "acme")]["n"] == 6 and found[(B, "other")]["code"] == "x"
