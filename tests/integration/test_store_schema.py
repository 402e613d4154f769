"""One definition of the event store's tables (``store/schema.py``): the tables the migrations create, those
``EventRecorder.create_table`` creates (a store from before the migrations), and an ``eventsourcing``
application's events table (``commitline.eventsourcing``) are the same, except where eventsourcing needs
otherwise: versions from 0 (no CHECK), and the originator id type it is configured with."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest
from eventsourcing.application import Application
from eventsourcing.postgres import PostgresDatastore

from commitline.composition import Commitline
from commitline.infrastructure.store.recorder import EventRecorder
from tests.eventsourcing_suite import library_environment
from tests.support import settings_for


class Orders(Application[UUID]):
    name = "Orders"


def shape(conn: psycopg.Connection[Any], schema: str, table: str) -> dict[str, Any]:
    """Columns, indexes (names apart), triggers, CHECK constraints and the id sequence's cache of one table."""
    relation = f'"{schema}"."{table}"'
    columns = conn.execute(
        "SELECT column_name, data_type, is_nullable, column_default, is_identity, identity_generation "
        "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table)).fetchall()
    indexes = conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
                           (schema, table)).fetchall()
    on_table = re.compile(rf"\b{re.escape(schema)}\.{re.escape(table)}\b")
    triggers = conn.execute("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass "
                            "AND NOT tgisinternal", (relation,)).fetchall()
    checks = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass "
                          "AND contype = 'c'", (relation,)).fetchall()
    cache = conn.execute("SELECT seqcache FROM pg_sequence WHERE seqrelid = "
                         "pg_get_serial_sequence(%s, 'notification_id')::regclass", (relation,)).fetchone() if any(
        c[0] == "notification_id" for c in columns) else None
    return {
        "columns": columns,
        "index names": sorted(name.replace(table, "<table>", 1) for name, _ in indexes),
        "indexes": sorted(on_table.sub("<table>", re.sub(r"INDEX \S+ ON", "INDEX ON", d)) for _, d in indexes),
        "triggers": sorted(on_table.sub("<table>", d).replace(f"{schema}.", "<schema>.") for (d,) in triggers),
        "checks": sorted(d for (d,) in checks),
        "id cache": cache[0] if cache else None,
    }


@pytest.fixture
def other_schema(pg_dsn: str, schema: str) -> Iterator[str]:
    name = f"{schema}_b"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def test_the_migrations_create_the_tables_the_recorder_defines(app: Commitline, pg_dsn: str, schema: str,
                                                               other_schema: str) -> None:
    parts = settings_for(pg_dsn, other_schema).connection_parts()
    datastore = PostgresDatastore(parts["dbname"], parts["host"], parts["port"], parts["user"], parts["password"],
                                  schema=other_schema)
    try:
        EventRecorder(datastore).create_table()
    finally:
        datastore.close()
    with psycopg.connect(pg_dsn) as conn:
        for table in ("events", "idempotency_keys", "snapshots"):
            assert shape(conn, schema, table) == shape(conn, other_schema, table), table
        assert shape(conn, schema, "events")["id cache"] == 1  # ids drawn in order: the gap proof needs it


@pytest.mark.parametrize("id_type", ["uuid", "text"])
def test_an_eventsourcing_applications_events_table_is_the_stores(app: Commitline, pg_dsn: str, schema: str,
                                                                   other_schema: str, id_type: str) -> None:
    env = library_environment(pg_dsn, other_schema, ORIGINATOR_ID_TYPE=id_type)
    Orders(env=env).close()  # creates its tables
    with psycopg.connect(pg_dsn) as conn:
        store, library = shape(conn, schema, "events"), shape(conn, other_schema, "orders_events")
    assert store["checks"] == ["CHECK ((originator_version > 0))"] and library["checks"] == []
    originator_id = [c for c in library["columns"] if c[0] == "originator_id"]
    assert originator_id and originator_id[0][1] == id_type
    library["columns"] = [c if c[0] != "originator_id" else (c[0], "uuid", *c[2:]) for c in library["columns"]]
    del store["checks"], library["checks"]
    assert store == library
