"""Follower positions, statuses and operator interventions: the one place their SQL lives.

``follower_positions`` holds one row per follower (the publisher, each projection, each
rebuild, each process manager's runner): how far it has handled the notification log, who owns
it, and whether it is running, retrying, stopped at a poison event ('failed'), or stopped.
``follower_interventions`` keeps every operator decision (skip, retry) with the error it
answered. Every function takes the connection to run on, so a caller can write a position
inside its own transaction (a projection's batch) or on its lease connection (fencing).
"""

from __future__ import annotations

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

    def claim(self, conn: Connection, name: str, owner: str, *, start_from: str | None = None) -> None:
        """Mark ``name`` running under ``owner`` (this process, described as ``process.this_process`` says);
        without a row yet, it starts at 0, or at the position of the follower ``start_from`` (a publisher bucket
        at the publisher's: republishing is safe, skipping is not)."""
        conn.execute(self._sql(
            # A follower stopped at a poison event stays stopped until an operator decides.
            "INSERT INTO {positions} AS t (name, owner, owner_process, status, position) VALUES (%s, %s, %s, "
            "'running', coalesce((SELECT position FROM {positions} WHERE name = %s), 0)) "
            "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, owner_process = excluded.owner_process, "
            "updated_at = now(), status = CASE WHEN t.status = 'failed' THEN 'failed' ELSE 'running' END"),
            (name, owner, Jsonb(this_process()), start_from))

    def owner_statements(self) -> list[Composed]:
        """Migration 8: each row records the process that owns it (host, pid, kind, started at)."""
        return [self._sql("ALTER TABLE {positions} ADD COLUMN IF NOT EXISTS owner_process jsonb")]

    def save(self, conn: Connection, name: str, position: int, *, poison: dict[str, Any] | None = None) -> None:
        """Move the position; with ``poison`` the follower stops there, waiting for an operator."""
        conn.execute(self._sql(
            "UPDATE {positions} SET position = %s, status = %s, error = %s, updated_at = now() WHERE name = %s"),
            (position, "failed" if poison else "running", Jsonb(poison) if poison else None, name))

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
