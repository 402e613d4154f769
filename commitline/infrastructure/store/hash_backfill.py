"""Schema step 3: upgrade, in place, a store created before the audit's hash chains.

Such a store (commitline before the audit, see the history of ``store/recorder.py``) has
``events`` without ``prev_hash``/``event_hash``, ``idempotency_keys`` without
``stream_version`` and ``snapshots`` without ``event_hash``. ``upgrade``:

1. adds the missing columns, nullable (a catalog-only change: no table rewrite);
2. computes every event's hashes in stream order (``chain.chain``: each stream from
   ``GENESIS``), in bounded batches that walk the primary key (originator_id,
   originator_version), one transaction per batch;
3. fills each idempotency record's ``stream_version`` from its stored outcome (the result's
   ``version``) and each snapshot's ``event_hash`` from the event at its version, in batches;
4. in one transaction holding ACCESS EXCLUSIVE locks, hashes whatever a still-running old
   writer appended meanwhile and sets the columns NOT NULL, as a fresh store has them.

Append-only during the backfill: the events table's row trigger rejects every UPDATE. Each
batch disables that trigger, updates, and enables it again *inside its own transaction*.
DDL is transactional in PostgreSQL: no other session ever sees the trigger disabled (the
change would become visible only at commit, and the commit holds it enabled again), and a
crash mid-batch rolls back to the enabled trigger. ``DISABLE TRIGGER`` takes a SHARE ROW
EXCLUSIVE lock, so appends wait for one batch (milliseconds; readers are not blocked), and
only rows whose ``event_hash`` is still NULL are updated, only in their two hash columns.
(``session_replication_role = replica`` would skip the trigger without any lock, but needs
a superuser.)

Crash-safe and re-runnable: each batch commits its hashes atomically. A re-run starts from
the first stream again and skips rows already hashed; since a stream's versions are hashed
in order, the event before the first unhashed one is always hashed and committed. Every
part looks at the catalog first, so on a current store (every fresh schema) nothing is done.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.application.chain import GENESIS, content, link
from commitline.infrastructure.store.schema import EVENTS_TABLE, IDEMPOTENCY_TABLE, SNAPSHOTS_TABLE

log = logging.getLogger(__name__)
Connection = psycopg.Connection[Any]
BATCH_ROWS = 2000
FIRST_EVENT = (UUID(int=0), 0)  # below every (originator_id, originator_version): versions start at 1
APPEND_ONLY_TRIGGER = "events_append_only"
#: table -> the columns this step adds (all bytea/bigint, NOT NULL once filled)
COLUMNS = {EVENTS_TABLE: {"prev_hash": "bytea", "event_hash": "bytea"},
           IDEMPOTENCY_TABLE: {"stream_version": "bigint"},
           SNAPSHOTS_TABLE: {"event_hash": "bytea"}}


class BackfillFailed(RuntimeError):
    """The store holds something the backfill cannot hash consistently; nothing of the batch was written."""


def _q(schema: str, text: str) -> Composed:
    return SQL(text).format(events=Identifier(schema, EVENTS_TABLE), idem=Identifier(schema, IDEMPOTENCY_TABLE),
                            snaps=Identifier(schema, SNAPSHOTS_TABLE), trigger=Identifier(APPEND_ONLY_TRIGGER))


def column_nullability(conn: Connection, schema: str) -> dict[tuple[str, str], bool]:
    """(table, column) -> is nullable, for the columns this step owns that exist."""
    rows = conn.cursor(row_factory=tuple_row).execute(
        "SELECT table_name, column_name, is_nullable = 'YES' FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = ANY(%s)", (schema, list(COLUMNS))).fetchall()
    return {(t, c): nullable for t, c, nullable in rows if c in COLUMNS.get(t, {})}


def needed(conn: Connection, schema: str) -> bool:
    """True unless every column exists and is NOT NULL (a current store)."""
    columns = column_nullability(conn, schema)
    return any(columns.get((t, c), True) for t, cs in COLUMNS.items() for c in cs)


def add_columns(conn: Connection, schema: str) -> None:
    existing = column_nullability(conn, schema)
    for table, columns in COLUMNS.items():
        for column, sql_type in columns.items():
            if (table, column) not in existing:
                conn.execute(SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    Identifier(schema, table), Identifier(column), SQL(sql_type)))


def hash_batch(conn: Connection, schema: str, after: tuple[UUID, int] | None, limit: int) -> tuple[UUID, int] | None:
    """Hash up to ``limit`` unhashed events from ``after`` on in (stream, version) order, in one transaction;
    returns the last key handled, or None when no unhashed event is left there. (``>=`` with the last key:
    that row is hashed by then, so the NULL filter drops it.)"""
    cur = conn.cursor(row_factory=tuple_row)
    with conn.transaction():
        # First, so no append commits between reading the rows and writing their hashes.
        cur.execute(_q(schema, "ALTER TABLE {events} DISABLE TRIGGER {trigger}"))
        rows = cur.execute(_q(schema,
            "SELECT originator_id, originator_version, topic, state FROM {events} WHERE event_hash IS NULL "
            "AND (originator_id, originator_version) >= (%s::uuid, %s::int8) "
            "ORDER BY originator_id, originator_version LIMIT %s"), (*(after or FIRST_EVENT), limit)).fetchall()
        if not rows:
            cur.execute(_q(schema, "ALTER TABLE {events} ENABLE TRIGGER {trigger}"))
            return None
        firsts: dict[UUID, int] = {}
        for originator_id, version, _, _ in rows:
            firsts.setdefault(originator_id, version)
        heads: dict[UUID, bytes] = {}
        for originator_id, version, found, prev in cur.execute(_q(schema,
                "SELECT f.id, f.v, e.originator_id IS NOT NULL, e.event_hash FROM unnest(%s::uuid[], %s::int8[]) "
                "AS f(id, v) LEFT JOIN {events} e ON e.originator_id = f.id AND e.originator_version = f.v - 1"),
                (list(firsts), list(firsts.values()))).fetchall():
            if found and prev is None:
                raise BackfillFailed(f"event {originator_id} v{version - 1} has no hash but a later one is hashed")
            heads[originator_id] = bytes(prev) if found else GENESIS  # a missing predecessor: as the recorder does
        updates: tuple[list[Any], ...] = ([], [], [], [])
        for originator_id, version, topic, state in rows:
            prev_hash = heads[originator_id]
            event_hash = link(prev_hash, content(originator_id, version, topic, bytes(state)))
            heads[originator_id] = event_hash
            for column, value in zip(updates, (originator_id, version, prev_hash, event_hash)):
                column.append(value)
        cur.execute(_q(schema,
            "UPDATE {events} e SET prev_hash = u.p, event_hash = u.h "
            "FROM unnest(%s::uuid[], %s::int8[], %s::bytea[], %s::bytea[]) AS u(id, v, p, h) "
            "WHERE e.originator_id = u.id AND e.originator_version = u.v AND e.event_hash IS NULL"), updates)
        cur.execute(_q(schema, "ALTER TABLE {events} ENABLE TRIGGER {trigger}"))
    return rows[-1][0], rows[-1][1]


def hash_events(conn: Connection, schema: str, batch_rows: int = BATCH_ROWS) -> int:
    """Hash every unhashed event, batch by batch; returns the number of batches that hashed something."""
    after, batches = None, 0
    while (after := hash_batch(conn, schema, after, batch_rows)) is not None:
        batches += 1
    return batches


def _fill_batches(conn: Connection, schema: str, statement: str, first: tuple[Any, Any], batch_rows: int) -> None:
    """Run a keyed UPDATE ... RETURNING key1, key2 batch by batch (keys from ``first`` on) until it updates nothing."""
    after = first
    while True:
        with conn.transaction():
            rows = conn.cursor(row_factory=tuple_row).execute(_q(schema, statement), {
                "a": after[0], "b": after[1], "n": batch_rows}).fetchall()
        if not rows:
            return
        after = max(rows)  # any key of the batch will do: the NULL filter skips what is done


FILL_STREAM_VERSIONS = (
    "WITH b AS (SELECT tenant, key FROM {idem} WHERE stream_version IS NULL "
    "AND (tenant, key) >= (%(a)s::text, %(b)s::text) ORDER BY tenant, key LIMIT %(n)s) "
    "UPDATE {idem} i SET stream_version = (convert_from(i.outcome, 'UTF8')::jsonb ->> 'version')::bigint "
    "FROM b WHERE i.tenant = b.tenant AND i.key = b.key RETURNING i.tenant, i.key")
FILL_SNAPSHOT_HASHES = (
    "WITH b AS (SELECT aggregate_id, version FROM {snaps} WHERE event_hash IS NULL "
    "AND (aggregate_id, version) >= (%(a)s::uuid, %(b)s::int8) ORDER BY aggregate_id, version "
    "LIMIT %(n)s) "
    "UPDATE {snaps} s SET event_hash = e.event_hash FROM b, {events} e WHERE s.aggregate_id = b.aggregate_id "
    "AND s.version = b.version AND e.originator_id = s.aggregate_id AND e.originator_version = s.version "
    "RETURNING s.aggregate_id, s.version")


def fill_the_rest(conn: Connection, schema: str, batch_rows: int = BATCH_ROWS) -> None:
    _fill_batches(conn, schema, FILL_STREAM_VERSIONS, ("", ""), batch_rows)
    _fill_batches(conn, schema, FILL_SNAPSHOT_HASHES, FIRST_EVENT, batch_rows)
    # A snapshot is a cache: one whose event does not exist could never be used.
    conn.execute(_q(schema, "DELETE FROM {snaps} WHERE event_hash IS NULL"))


def upgrade(conn: Connection, schema: str, batch_rows: int = BATCH_ROWS) -> None:
    """Bring a pre-hash store to the current shape (``conn`` in autocommit mode); a no-op on a current one."""
    if not needed(conn, schema):
        return
    add_columns(conn, schema)
    batches = hash_events(conn, schema, batch_rows)
    fill_the_rest(conn, schema, batch_rows)
    with conn.transaction():
        conn.execute(_q(schema, "LOCK TABLE {events}, {idem}, {snaps} IN ACCESS EXCLUSIVE MODE"))
        hash_events(conn, schema, batch_rows)  # what an old writer appended meanwhile (nothing, once it stopped)
        fill_the_rest(conn, schema, batch_rows)
        for (table, column), nullable in column_nullability(conn, schema).items():
            if nullable:
                conn.execute(SQL("ALTER TABLE {} ALTER COLUMN {} SET NOT NULL").format(
                    Identifier(schema, table), Identifier(column)))
    log.info("schema %s: hash chains computed for the events of a pre-audit store (%d batches)", schema, batches)
