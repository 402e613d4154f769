"""Follower positions, statuses and operator interventions: the one place their SQL lives (the coordination
layer's tables; the locks that fence them are ``fenced.py``'s).

``follower_positions`` holds one row per follower (the publisher, each projection, each
rebuild, each process manager's runner): how far it has handled the notification log, who owns
it, and whether it is running, retrying, stopped at a poison event ('failed'), or stopped.
Each row also records the store generation (``store/generations.py``) its position was
saved in: a follower writes the generation it joined under with every save, and checks it when it takes
the row (``went_back.py``). ``follower_interventions`` keeps every operator decision (skip, retry, reset)
with the error it answered. Every function takes the connection to run on, so a caller can write a position
inside its own transaction (a projection's batch) or on its lease connection (fencing).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier
from psycopg.types.json import Jsonb

from commitline.infrastructure.followers.process import this_process

POSITIONS_TABLE = "follower_positions"
INTERVENTIONS_TABLE = "follower_interventions"
Connection = psycopg.Connection[Any]


@dataclass(frozen=True)
class FollowerRow:
    name: str
    position: int
    owner: str | None
    status: str
    error: dict[str, Any] | None
    updated_at: datetime


class Positions:
    """The positions and interventions tables of one schema."""

    def __init__(self, schema: str):
        self.schema = schema
        self.table = Identifier(schema, POSITIONS_TABLE)
        self.interventions = Identifier(schema, INTERVENTIONS_TABLE)

    def _sql(self, text: str) -> Composed:
        return SQL(text).format(positions=self.table, interventions=self.interventions)

    def create_statements(self) -> list[Composed]:
        """The DDL of both tables, for the schema migrations."""
        return [
            self._sql(
                "CREATE TABLE IF NOT EXISTS {positions} ("
                " name text PRIMARY KEY,"
                " position bigint NOT NULL DEFAULT 0,"
                " owner text,"
                " status text NOT NULL DEFAULT 'idle',"
                " error jsonb,"
                " updated_at timestamptz NOT NULL DEFAULT now())"),
            self._sql(
                "CREATE TABLE IF NOT EXISTS {interventions} ("
                " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " name text NOT NULL,"
                " action text NOT NULL,"
                " position bigint NOT NULL,"
                " detail jsonb NOT NULL,"
                " at timestamptz NOT NULL DEFAULT now())"),
        ]

    def all(self, conn: Connection) -> list[FollowerRow]:
        rows = conn.cursor(row_factory=tuple_row).execute(self._sql(
            "SELECT name, position, owner, status, error, updated_at FROM {positions} ORDER BY name")).fetchall()
        return [FollowerRow(*row) for row in rows]

    def read(self, conn: Connection, name: str, *, for_update: bool = False) -> tuple[int, str, dict[str, Any] | None]:
        """(position, status, error) of a follower; (0, 'never run', None) when it has no row."""
        row = conn.cursor(row_factory=tuple_row).execute(self._sql(
            "SELECT position, status, error FROM {positions} WHERE name = %s"
            + (" FOR UPDATE" if for_update else "")), (name,)).fetchone()
        return (int(row[0]), str(row[1]), row[2]) if row else (0, "never run", None)

    def claim(self, conn: Connection, name: str, owner: str, *, start_from: str | None = None,
              generation: int = 1) -> None:
        """Mark ``name`` running under ``owner`` (this process, described as ``process.this_process`` says);
        without a row yet, it starts at 0 in ``generation``, or at the position (and in the generation) of the
        follower ``start_from`` (a publisher bucket at the publisher's: republishing is safe, skipping is not).
        An existing row keeps its generation: the owner checks it (``went_back.py``). An existing row behind
        ``start_from`` in the same generation goes on from there: a bucket of another count's (the setting
        changed and back) whose events the buckets since published, all of them up to that position."""
        conn.execute(self._sql(
            # A follower stopped at a poison event stays stopped until an operator decides.
            "INSERT INTO {positions} AS t (name, owner, owner_process, status, position, generation) "
            "VALUES (%(name)s, %(owner)s, %(process)s, 'running', "
            "coalesce((SELECT position FROM {positions} WHERE name = %(from)s), 0), "
            "coalesce((SELECT generation FROM {positions} WHERE name = %(from)s), %(generation)s)) "
            "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, owner_process = excluded.owner_process, "
            "updated_at = now(), status = CASE WHEN t.status = 'failed' THEN 'failed' ELSE 'running' END, "
            "position = CASE WHEN t.status <> 'failed' AND t.generation = excluded.generation "
            " THEN greatest(t.position, excluded.position) ELSE t.position END"),
            {"name": name, "owner": owner, "process": Jsonb(this_process()), "from": start_from,
             "generation": generation})

    def owner_statements(self) -> list[Composed]:
        """Migration 8: each row records the process that owns it (host, pid, kind, started at)."""
        return [self._sql("ALTER TABLE {positions} ADD COLUMN IF NOT EXISTS owner_process jsonb")]

    def generation_statements(self) -> list[Composed]:
        """Migration 12: each row records the store generation its position was saved in (existing rows: 1)."""
        return [self._sql("ALTER TABLE {positions} ADD COLUMN IF NOT EXISTS generation int NOT NULL DEFAULT 1")]

    def save(self, conn: Connection, name: str, position: int, *, poison: dict[str, Any] | None = None,
             generation: int | None = None) -> None:
        """Move the position (saved in ``generation``; None keeps the row's); with ``poison`` the follower stops
        there, waiting for an operator."""
        conn.execute(self._sql(
            "UPDATE {positions} SET position = %s, status = %s, error = %s, generation = coalesce(%s, generation), "
            "updated_at = now() WHERE name = %s"),
            (position, "failed" if poison else "running", Jsonb(poison) if poison else None, generation, name))

    def set_status(self, conn: Connection, name: str, status: str, error: dict[str, Any] | None = None) -> None:
        conn.execute(self._sql("UPDATE {positions} SET status = %s, error = %s, updated_at = now() WHERE name = %s"),
                     (status, Jsonb(error) if error is not None else None, name))

    def released(self, conn: Connection, name: str, status: str) -> None:
        """The owner let go: ``status`` unless the follower is stopped at a poison event, which stays on record
        (with its error) until an operator's ``retry`` or ``skip``."""
        conn.execute(self._sql(
            "UPDATE {positions} SET status = CASE WHEN status = 'failed' THEN status ELSE %s END, "
            "error = CASE WHEN status = 'failed' THEN error END, updated_at = now() WHERE name = %s"), (status, name))

    def delete(self, conn: Connection, name: str) -> None:
        conn.execute(self._sql("DELETE FROM {positions} WHERE name = %s"), (name,))

    # -- many rows at once: a group's buckets (``group.py``), ``status`` ------------------

    def read_many(self, conn: Connection, names: Iterable[str]) -> dict[str, tuple[int, str]]:
        """(position, status) of each named follower that has a row."""
        return {name: (int(position), str(status)) for name, position, status in conn.cursor(
            row_factory=tuple_row).execute(self._sql(
                "SELECT name, position, status FROM {positions} WHERE name = ANY(%s)"), (list(names),))}

    def save_many(self, conn: Connection, rows: Sequence[tuple[str, int, dict[str, Any] | None]],
                  generation: int | None = None) -> None:
        """``save`` for many (name, position, poison or None) in one statement."""
        conn.execute(self._sql(
            "UPDATE {positions} AS t SET position = u.position, status = CASE WHEN u.error IS NULL THEN 'running' "
            "ELSE 'failed' END, error = u.error::jsonb, generation = coalesce(%s, t.generation), updated_at = now() "
            "FROM unnest(%s::text[], %s::int8[], %s::text[]) AS u(name, position, error) WHERE t.name = u.name"),
            (generation, [n for n, _, _ in rows], [p for _, p, _ in rows],
             [None if e is None else json.dumps(e) for _, _, e in rows]))

    def read_slots(self, conn: Connection, names: Iterable[str]) -> dict[str, tuple[int, str, int]]:
        """(position, status, generation) of each named follower that has a row."""
        return {name: (int(position), str(status), int(generation)) for name, position, status, generation in
                conn.cursor(row_factory=tuple_row).execute(self._sql(
                    "SELECT name, position, status, generation FROM {positions} WHERE name = ANY(%s)"),
                    (list(names),))}

    def group_rows(self, conn: Connection, group: str) -> list[tuple[str, int, str, dict[str, Any] | None, int]]:
        """(name, position, status, error, generation) of the follower ``group`` and of every bucket of it (of
        any count), locked for update."""
        return [(n, int(p), str(s), e, int(g)) for n, p, s, e, g in conn.cursor(row_factory=tuple_row).execute(
            self._sql("SELECT name, position, status, error, generation FROM {positions} "
                      "WHERE name = %s OR starts_with(name, %s) ORDER BY name FOR UPDATE"),
            (group, f"{group}/")).fetchall()]

    def place(self, conn: Connection, name: str, position: int, generation: int) -> None:
        """The row of a follower that never ran, at ``position`` in ``generation``, stopped (none if it has one)."""
        conn.execute(self._sql("INSERT INTO {positions} (name, position, status, generation) "
                               "VALUES (%s, %s, 'stopped', %s) ON CONFLICT (name) DO NOTHING"),
                     (name, position, generation))

    def reset(self, conn: Connection, name: str, position: int, status: str, generation: int) -> None:
        """An operator's reset: ``position`` in ``generation``, ``status``, no error."""
        conn.execute(self._sql("UPDATE {positions} SET position = %s, status = %s, error = NULL, generation = %s, "
                               "updated_at = now() WHERE name = %s"), (position, status, generation, name))

    def mark_many(self, conn: Connection, status: str, errors: dict[str, dict[str, Any]]) -> None:
        """``set_status`` for many followers, each with its own error, in one statement."""
        conn.execute(self._sql(
            "UPDATE {positions} AS t SET status = %s, error = u.error::jsonb, updated_at = now() "
            "FROM unnest(%s::text[], %s::text[]) AS u(name, error) WHERE t.name = u.name"),
            (status, list(errors), [json.dumps(e) for e in errors.values()]))

    def highest_of_group(self, conn: Connection, group: str) -> int:
        """The highest position saved by the group ``group`` or any bucket of it (of any bucket count)."""
        return int(conn.cursor(row_factory=tuple_row).execute(self._sql(
            "SELECT coalesce(max(position), 0) FROM {positions} WHERE name = %s OR starts_with(name, %s)"),
            (group, f"{group}/")).fetchone()[0])

    def reset_group(self, conn: Connection, group: str) -> None:
        """The group ``group`` and every bucket of it start again from the first event."""
        conn.execute(self._sql("UPDATE {positions} SET position = 0, updated_at = now() "
                               "WHERE name = %s OR starts_with(name, %s)"), (group, f"{group}/"))

    def write_summary(self, conn: Connection, group: str, names: list[str], owner: str | None, status: str) -> None:
        """The row of ``group`` from its bucket rows ``names``: the lowest position (but never past the group's
        own while some bucket has no row: that bucket will start from it), ``failed`` or ``retrying`` with the
        first such bucket's error (naming the bucket), else ``status``; ``owner`` None keeps it."""
        conn.execute(self._sql(
            "WITH b AS (SELECT name, position, status, error FROM {positions} WHERE name = ANY(%(names)s)), "
            "bad AS (SELECT status, coalesce(error, '{{}}'::jsonb) || jsonb_build_object('bucket', name) AS error "
            " FROM b WHERE status IN ('failed', 'retrying') ORDER BY status = 'failed' DESC, name LIMIT 1), "
            "own AS (SELECT position FROM {positions} WHERE name = %(name)s), "
            "s AS (SELECT CASE WHEN (SELECT count(*) FROM b) >= cardinality(%(names)s::text[]) "
            " THEN (SELECT min(position) FROM b) "
            " ELSE least((SELECT min(position) FROM b), coalesce((SELECT position FROM own), 0)) END AS position) "
            "INSERT INTO {positions} AS t (name, position, owner, status, error, generation) "
            "SELECT %(name)s, coalesce(s.position, (SELECT position FROM own), 0), %(owner)s, "
            " coalesce((SELECT status FROM bad), %(status)s), (SELECT error FROM bad), "
            " coalesce((SELECT min(generation) FROM {positions} WHERE name = ANY(%(names)s)), "
            " (SELECT generation FROM {positions} WHERE name = %(name)s), 1) FROM s "
            "ON CONFLICT (name) DO UPDATE SET position = excluded.position, "
            " owner = coalesce(excluded.owner, t.owner), status = excluded.status, error = excluded.error, "
            " generation = excluded.generation, updated_at = now()"),
            {"names": names, "name": group, "owner": owner, "status": status})

    def stopped_in_group(self, conn: Connection, group: str) -> list[tuple[str, dict[str, Any]]]:
        """(bucket name, error) of every bucket of ``group`` (of any count) stopped at a poison event."""
        return [(n, e) for n, e in conn.cursor(row_factory=tuple_row).execute(self._sql(
            "SELECT name, error FROM {positions} WHERE starts_with(name, %s) AND status = 'failed' "
            "AND error IS NOT NULL ORDER BY name"), (f"{group}/",)).fetchall()]

    def status_rows(self, conn: Connection, names: Sequence[str] | None = None) -> dict[str, tuple[Any, ...]]:
        """Every row (or the named ones) for ``status``: name, position, owner, status, error, updated_at, seconds
        since it was updated, owner_process, the store generation its position was saved in."""
        query = self._sql(
            "SELECT name, position, owner, status, error, updated_at, "
            "extract(epoch FROM clock_timestamp() - updated_at)::float8, owner_process, generation FROM {positions}"
            + ("" if names is None else " WHERE name = ANY(%s)"))
        return {r[0]: r for r in conn.cursor(row_factory=tuple_row).execute(
            query, () if names is None else (list(names),)).fetchall()}

    def skipped(self, conn: Connection, name: str) -> dict[int, dict[str, Any]]:
        """The positions an operator decided to skip for ``name``, each with the decision's detail."""
        rows = conn.cursor(row_factory=tuple_row).execute(self._sql(
            "SELECT position, detail FROM {interventions} WHERE name = %s AND action = 'skip' ORDER BY id"),
            (name,)).fetchall()
        return {int(position): detail for position, detail in rows}

    def record_intervention(self, conn: Connection, name: str, action: str, position: int,
                            detail: dict[str, Any]) -> None:
        conn.execute(self._sql("INSERT INTO {interventions} (name, action, position, detail) VALUES (%s, %s, %s, %s)"),
                     (name, action, position, Jsonb(detail)))
