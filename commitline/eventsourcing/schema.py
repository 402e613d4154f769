"""The tables of an ``eventsourcing`` application on commitline's store, and creating them.

Per application (``<prefix>`` is the application's name in lower case, as eventsourcing names it):
``<prefix>_events`` (commitline's events layout: identity notification ids drawn in order, the
writer's xid, the hash chain, append-only triggers; versions from 0 as eventsourcing allows),
``<prefix>_events_idempotency`` (keys recorded with the events that carried them) and
``<prefix>_snapshots`` (a plain aggregate table). The schema is created when missing.
"""

from __future__ import annotations

from typing import Any

from psycopg.sql import SQL, Composed, Identifier


def lock_schema(curs: Any, schema: str) -> None:
    """Serialise table creation in ``schema`` with commitline's own migrations (the same advisory key):
    concurrent ``CREATE ... IF NOT EXISTS`` and ``CREATE OR REPLACE`` race otherwise."""
    curs.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"commitline-schema-{schema}",))
    curs.execute(SQL("CREATE SCHEMA IF NOT EXISTS {}").format(Identifier(schema)))


def ensure_schema(datastore: Any) -> None:
    with datastore.transaction(commit=True) as curs:
        lock_schema(curs, datastore.schema)


def events_table(schema: str, table: str, id_type: str) -> Composed:
    return SQL(
        "CREATE TABLE IF NOT EXISTS {table} ("
        " notification_id bigint GENERATED ALWAYS AS IDENTITY (CACHE 1),"
        " originator_id {id_type} NOT NULL,"
        " originator_version bigint NOT NULL,"
        " topic text NOT NULL,"
        " state bytea NOT NULL,"
        " txid xid8 NOT NULL DEFAULT pg_current_xact_id(),"
        " prev_hash bytea NOT NULL,"
        " event_hash bytea NOT NULL,"
        " PRIMARY KEY (originator_id, originator_version))"
    ).format(table=Identifier(schema, table), id_type=SQL(id_type))


def notification_id_index(schema: str, table: str) -> Composed:
    return SQL("CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {table} (notification_id)").format(
        index=Identifier(f"{table}_notification_id_idx"), table=Identifier(schema, table))


def idempotency_table(schema: str, table: str) -> Composed:
    return SQL(
        "CREATE TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, recorded_at timestamptz NOT NULL DEFAULT now())"
    ).format(table=Identifier(schema, table))


def snapshots_table(schema: str, table: str, id_type: str) -> Composed:
    return SQL(
        "CREATE TABLE IF NOT EXISTS {table} ("
        " originator_id {id_type} NOT NULL,"
        " originator_version bigint NOT NULL,"
        " topic text NOT NULL,"
        " state bytea NOT NULL,"
        " PRIMARY KEY (originator_id, originator_version))"
    ).format(table=Identifier(schema, table), id_type=SQL(id_type))
