"""The store's generations: which history its notification ids belong to.

Notification ids are positions in one history. A restore from a backup, or an asynchronous failover that lost
acknowledged commits, starts another history in which the ids after the new head are used again by other
events. The operator says so with ``commitline store new-generation`` (``new_generation``), which appends a row
to ``store_generations``: its number, when, why, and the log head at that moment. Generation 1 is recorded when
the store is created (or when an older store is migrated). The table, like the events and the erasures,
rejects UPDATE, DELETE and TRUNCATE: a generation once started stays on record.

Followers record the generation they run under with their positions, and the publisher puts it in every
Kafka envelope (``followers/went_back.py`` and ``kafka/broker_check.py`` compare them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.infrastructure.store.schema import EVENTS_TABLE

GENERATIONS_TABLE = "store_generations"
FIRST_REASON = "the first history of the store"
log = logging.getLogger(__name__)
Connection = psycopg.Connection[Any]


def create_statements(schema: str) -> list[Composed]:
    """The DDL of the table and its append-only triggers, and generation 1 with the head the store has now (a
    schema migration)."""
    names = {"t": Identifier(schema, GENERATIONS_TABLE), "events": Identifier(schema, EVENTS_TABLE),
             "reject": Identifier(schema, "reject_generation_change")}
    return [SQL(text).format(**names) for text in (
        "CREATE TABLE IF NOT EXISTS {t} (generation int PRIMARY KEY CHECK (generation >= 1),"
        " started_at timestamptz NOT NULL DEFAULT now(), reason text NOT NULL,"
        " head bigint NOT NULL, timeline int, system_identifier text)",
        "CREATE OR REPLACE FUNCTION {reject}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'store generations are append-only: % on %.% rejected', TG_OP, TG_TABLE_SCHEMA, "
        "TG_TABLE_NAME USING ERRCODE = 'restrict_violation'; END $$",
        "CREATE OR REPLACE TRIGGER store_generations_append_only BEFORE UPDATE OR DELETE ON {t} "
        "FOR EACH ROW EXECUTE FUNCTION {reject}()",
        "CREATE OR REPLACE TRIGGER store_generations_no_truncate BEFORE TRUNCATE ON {t} "
        "FOR EACH STATEMENT EXECUTE FUNCTION {reject}()",
        "INSERT INTO {t} (generation, reason, head) SELECT 1, '" + FIRST_REASON + "', "
        "coalesce((SELECT max(notification_id) FROM {events}), 0) WHERE NOT EXISTS (SELECT FROM {t})",
    )]


@dataclass(frozen=True)
class Generation:
    """One history of the store: its number, when and why it started, and the log head then (the ids above it
    are this generation's own). ``timeline`` and ``system_identifier`` are the server's when that was readable."""

    generation: int
    started_at: datetime
    reason: str
    head: int
    timeline: int | None = None
    system_identifier: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "started_at": self.started_at.isoformat()}


def _table(schema: str) -> Identifier:
    return Identifier(schema, GENERATIONS_TABLE)


def current(conn: Connection, schema: str) -> Generation:
    """The store's current generation (the highest)."""
    row = conn.cursor(row_factory=tuple_row).execute(SQL(
        "SELECT generation, started_at, reason, head, timeline, system_identifier FROM {} "
        "ORDER BY generation DESC LIMIT 1").format(_table(schema))).fetchone()
    if row is None:  # a schema not migrated this far; migrations record generation 1
        raise LookupError(f"schema {schema} records no store generation: run commitline migrate")
    return Generation(*row)


def current_and_head(conn: Connection, schema: str) -> tuple[int, int]:
    """(the current generation, the log head), in one statement."""
    row = conn.cursor(row_factory=tuple_row).execute(SQL(
        "SELECT (SELECT max(generation) FROM {t}), (SELECT coalesce(max(notification_id), 0) FROM {events})").format(
        t=_table(schema), events=Identifier(schema, EVENTS_TABLE))).fetchone()
    assert row is not None
    return int(row[0] or 1), int(row[1])


def _server_identity(conn: Connection) -> tuple[int | None, str | None]:
    """The server's timeline and system identifier, when this role may read them (``pg_control_*`` functions
    need pg_monitor or superuser); (None, None) otherwise."""
    try:
        with conn.transaction():
            row = conn.cursor(row_factory=tuple_row).execute(
                "SELECT (pg_control_checkpoint()).timeline_id, (pg_control_system()).system_identifier::text"
            ).fetchone()
    except psycopg.Error:
        return None, None
    return (int(row[0]), str(row[1])) if row else (None, None)


def new_generation(conn: Connection, schema: str, reason: str) -> Generation:
    """Start the next generation (``reason`` says why), with the log head of now; ``conn`` in autocommit mode."""
    timeline, system = _server_identity(conn)
    with conn.transaction():
        conn.execute(SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(_table(schema)))
        # Appends under way finish first and the next wait for this commit: every event above the head read here
        # commits after the new generation does, so a publisher that reads one and then the generation sees the
        # new one (``Follower.checks_generation_each_page``), and never sends it under the old.
        conn.execute(SQL("LOCK TABLE {} IN SHARE MODE").format(Identifier(schema, EVENTS_TABLE)))
        row = conn.cursor(row_factory=tuple_row).execute(SQL(
            "INSERT INTO {t} (generation, reason, head, timeline, system_identifier) "
            "SELECT coalesce(max(generation), 0) + 1, %s, (SELECT coalesce(max(notification_id), 0) FROM {events}), "
            "%s, %s FROM {t} RETURNING generation, started_at, reason, head, timeline, system_identifier").format(
            t=_table(schema), events=Identifier(schema, EVENTS_TABLE)), (reason, timeline, system)).fetchone()
    assert row is not None
    started = Generation(*row)
    log.warning("store %s: generation %d started at head %d: %s", schema, started.generation, started.head, reason)
    return started


def event_ids_at(conn: Connection, schema: str, notification_ids: list[int]) -> dict[int, str]:
    """The event id the store holds at each of ``notification_ids`` (those it holds)."""
    rows = conn.cursor(row_factory=tuple_row).execute(SQL(
        "SELECT notification_id, state FROM {} WHERE notification_id = ANY(%s)").format(
        Identifier(schema, EVENTS_TABLE)), (notification_ids,)).fetchall()
    return {int(n): str(orjson.loads(bytes(state))["id"]) for n, state in rows}
