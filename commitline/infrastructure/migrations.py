"""The versioned schema: ordered migration steps, applied under the schema's advisory lock.

A process start costs one cheap read (``schema_version``): no DDL touches the hot tables, so
a start never queues behind an open append, and appends never queue behind a start. Only
when the stored version is behind ``LATEST`` are the missing steps applied, each in its own
transaction together with its row in ``schema_migrations``, while holding a session advisory
lock on the schema: any number of processes may start at once on an empty schema; one
applies the steps, the others wait for it and then find nothing to do.

Every step is idempotent (``IF NOT EXISTS``, ``CREATE OR REPLACE``), so a store created
before this table existed is adopted by applying the steps it already has as no-ops.
Steps are only ever appended: a released step never changes. A step may also ``run`` code
before its statements, for work too big for one transaction: step 3 upgrades a store from
before the audit's hash chains, computing every event's hashes in bounded batches while the
append-only trigger stays in force for every other session (``store/hash_backfill.py`` says how).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.application.errors import ConfigurationError
from commitline.infrastructure.followers.positions import Connection, Positions
from commitline.infrastructure.personal import keys as data_keys
from commitline.infrastructure.store import api_keys, audit_runs, event_versions, generations, hash_backfill
from commitline.infrastructure.store.schema import (
    lock_key,
    store_append_function_statements,
    store_keyed_append_statements,
    store_proven_append_statements,
    store_referenced_record_statements,
    store_schema_statements,
)

log = logging.getLogger(__name__)
MIGRATIONS_TABLE = "schema_migrations"


@dataclass(frozen=True)
class Migration:
    """One step: its DDL (``statements``, for a schema), applied with its row in ``schema_migrations``."""

    version: int
    description: str
    statements: Callable[[str], Sequence[Composed]] = lambda schema: ()
    #: work done before ``statements`` in bounded transactions of its own (a backfill), with ``conn`` in
    #: autocommit mode; idempotent and safe to run again after a crash mid-way, as every step is
    run: Callable[[Connection, str], None] | None = None


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "event store: events (append-only, hash-chained), idempotency keys, snapshots",
              store_schema_statements),
    Migration(2, "followers: positions and operator interventions", lambda schema: Positions(schema).create_statements()),
    Migration(3, "event store from before the audit: hash-chain columns computed in stream order, idempotency "
              "stream versions, snapshot hashes", run=hash_backfill.upgrade),
    Migration(4, "tenants' API keys (hashes only) for the HTTP API", api_keys.create_statements),
    Migration(5, "audit verification runs, for the status page", audit_runs.create_statements),
    Migration(6, "event store: one command's append as one statement (group commit, one sync per batch)",
              store_append_function_statements),
    Migration(7, "event types and class versions the store holds, checked against the domain at start",
              event_versions.create_statements),
    Migration(8, "followers: the process owning each one (host, pid, kind, started at), for status",
              lambda schema: Positions(schema).owner_statements()),
    Migration(9, "personal data: each data subject's wrapped data key (the one table whose rows are deleted), and "
              "the append-only record of erasures", data_keys.create_statements),
    Migration(10, "tenants' administrative API keys (may erase data subjects over HTTP)", api_keys.admin_statements),
    Migration(11, "event store: an append proves its predecessor (the version before it, stored with the hash it "
              "chains from) in the group commit's append functions", store_proven_append_statements),
    Migration(12, "store generations (append-only; generation 1 now), recorded with every follower position",
              lambda schema: [*generations.create_statements(schema), *Positions(schema).generation_statements()]),
    Migration(13, "event store: append functions that insert the data keys of a command's new data subjects in its "
              "append's transaction", store_keyed_append_statements),
    Migration(14, "idempotency records refer to their command's events (event count, aggregate type) instead of "
              "holding a copy of its outcome; a BRIN index on recorded_at for the retention job",
              store_referenced_record_statements),
    Migration(15, "tenants' API keys: every change to the table is notified, so the processes caching keys drop them",
              api_keys.change_notice_statements),
    Migration(16, "personal data: the master keys in use (ids only), so a wrong one is refused even when every "
              "subject was erased", data_keys.master_key_statements),
    Migration(17, "audit verification runs are append-only (triggers reject UPDATE, DELETE and TRUNCATE)",
              audit_runs.append_only_statements),
    Migration(18, "personal data: a data key wrapped under a master key a rotation retired is refused (a process "
              "that still has the old key alone writes nothing)", data_keys.retired_master_statements),
)
LATEST = MIGRATIONS[-1].version
#: Every table a migrated store holds (a test compares it with a fresh store's): a read model's table must have
#: another name, since a rebuild drops its tables and swaps new ones in (the domain check refuses these).
STORE_TABLES = frozenset({
    MIGRATIONS_TABLE, "events", "idempotency_keys", "snapshots", "follower_positions", "follower_interventions",
    "api_keys", "audit_runs", "event_versions", "data_keys", "erasures", "store_generations", "master_keys",
})


class NoStore(ConfigurationError):
    """The schema holds no store, and the command only reads one: a configuration error (exit 3), nothing made."""

    variable = "COMMITLINE_SCHEMA"


class SchemaTooNew(ConfigurationError):
    """The store was migrated by a newer commitline than this one: a configuration error (exit 3), never written."""

    variable = "COMMITLINE_SCHEMA"


def schema_version(conn: Connection, schema: str) -> int:
    """The version the store is at; 0 for an empty schema."""
    cur = conn.cursor(row_factory=tuple_row)
    table = Identifier(schema, MIGRATIONS_TABLE)
    exists = cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}"."{MIGRATIONS_TABLE}"',)).fetchone()
    if not (exists and exists[0]):
        return 0
    row = cur.execute(SQL("SELECT coalesce(max(version), 0) FROM {}").format(table)).fetchone()
    return int(row[0]) if row else 0


def pending(conn: Connection, schema: str) -> list[Migration]:
    current = schema_version(conn, schema)
    if current > LATEST:
        raise SchemaTooNew(reason=f"schema {schema} is at version {current}, newer than this commitline knows "
                           f"({LATEST}); run a commitline at least as new as the one that migrated it")
    return [m for m in MIGRATIONS if m.version > current]


def migrate(conn: Connection, schema: str) -> list[Migration]:
    """Apply the missing steps (``conn`` in autocommit mode); returns those this call applied."""
    if not pending(conn, schema):  # the common case: one read, no lock
        return []
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (lock_key(schema),))
    try:
        conn.execute(SQL("CREATE SCHEMA IF NOT EXISTS {}").format(Identifier(schema)))
        conn.execute(SQL("CREATE TABLE IF NOT EXISTS {} (version int PRIMARY KEY, description text NOT NULL, "
                         "applied_at timestamptz NOT NULL DEFAULT now())").format(Identifier(schema, MIGRATIONS_TABLE)))
        applied = []
        for step in pending(conn, schema):  # read again under the lock: another process may have done it
            if step.run is not None:
                step.run(conn, schema)
            with conn.transaction():
                for statement in step.statements(schema):
                    conn.execute(statement)
                conn.execute(SQL("INSERT INTO {} (version, description) VALUES (%s, %s)").format(
                    Identifier(schema, MIGRATIONS_TABLE)), (step.version, step.description))
            log.info("schema %s: applied migration %d (%s)", schema, step.version, step.description)
            applied.append(step)
        return applied
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (lock_key(schema),))
