"""Operator decisions about a projection stopped at a poison event: skip it or retry it.

Both are explicit: a skip must name the exact position the projection stopped at, and
every decision is logged and kept in ``follower_interventions`` with the error it answered.
"""

from __future__ import annotations

import logging
from typing import Any

from eventsourcing.postgres import PostgresDatastore
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier
from psycopg.types.json import Jsonb

from commitline.infrastructure.followers.lease import INTERVENTIONS_TABLE, POSITIONS_TABLE

log = logging.getLogger(__name__)


class InterventionRefused(RuntimeError):
    pass


def _stopped_at(conn: Any, schema: str, name: str) -> dict[str, Any]:
    row = conn.cursor(row_factory=tuple_row).execute(
        SQL("SELECT status, error FROM {} WHERE name = %s FOR UPDATE").format(Identifier(schema, POSITIONS_TABLE)),
        (name,)).fetchone()
    if row is None or row[0] != "failed" or not row[1]:
        raise InterventionRefused(f"{name} is not stopped at a poison event (status: {row[0] if row else 'never run'})")
    return row[1]


def _record(conn: Any, schema: str, name: str, action: str, position: int, detail: dict[str, Any]) -> None:
    conn.execute(SQL("INSERT INTO {} (name, action, position, detail) VALUES (%s, %s, %s, %s)").format(
        Identifier(schema, INTERVENTIONS_TABLE)), (name, action, position, Jsonb(detail)))


def skip(datastore: PostgresDatastore, name: str, position: int, reason: str = "") -> str:
    schema = datastore.schema
    with datastore.get_connection() as conn, conn.transaction():
        error = _stopped_at(conn, schema, name)
        if error["position"] != position:
            raise InterventionRefused(
                f"{name} stopped at position {error['position']}, not {position}: refusing to skip anything else")
        conn.execute(SQL("UPDATE {} SET position = %s, status = 'running', error = NULL, updated_at = now() "
                         "WHERE name = %s").format(Identifier(schema, POSITIONS_TABLE)), (position, name))
        _record(conn, schema, name, "skip", position, {"error": error, "reason": reason})
    log.warning("projection %s: operator skipped poison event at position %d (%s): %s", name, position,
                error["event_type"], reason or "no reason given")
    return f"{name}: skipped the {error['event_type']} event at position {position}; the projector continues after it"


def retry(datastore: PostgresDatastore, name: str) -> str:
    schema = datastore.schema
    with datastore.get_connection() as conn, conn.transaction():
        error = _stopped_at(conn, schema, name)
        conn.execute(SQL("UPDATE {} SET status = 'running', error = NULL, updated_at = now() WHERE name = %s").format(
            Identifier(schema, POSITIONS_TABLE)), (name,))
        _record(conn, schema, name, "retry", error["position"], {"error": error})
    log.warning("projection %s: operator asked to retry the event at position %d", name, error["position"])
    return f"{name}: will retry the event at position {error['position']}"
