"""Operator decisions about a follower (a projection, the publisher) stopped at a poison event: skip it or
retry it.

Both are explicit: a skip must name the exact position the projection stopped at, and
every decision is logged and kept in ``follower_interventions`` with the error it answered.
"""

from __future__ import annotations

import logging
from typing import Any

from eventsourcing.postgres import PostgresDatastore

from commitline.infrastructure.followers.positions import Positions

log = logging.getLogger(__name__)


class InterventionRefused(RuntimeError):
    pass


def _stopped_at(positions: Positions, conn: Any, name: str) -> dict[str, Any]:
    _, status, error = positions.read(conn, name, for_update=True)
    if status != "failed" or not error:
        raise InterventionRefused(f"{name} is not stopped at a poison event (status: {status})")
    return error


def skip(datastore: PostgresDatastore, name: str, position: int, reason: str = "") -> str:
    positions = Positions(datastore.schema)
    with datastore.get_connection() as conn, conn.transaction():
        error = _stopped_at(positions, conn, name)
        if error["position"] != position:
            raise InterventionRefused(
                f"{name} stopped at position {error['position']}, not {position}: refusing to skip anything else")
        positions.save(conn, name, position)
        positions.record_intervention(conn, name, "skip", position, {"error": error, "reason": reason})
    log.warning("%s: operator skipped poison event at position %d (%s): %s", name, position,
                error["event_type"], reason or "no reason given")
    return f"{name}: skipped the {error['event_type']} event at position {position}; it continues after it"


def retry(datastore: PostgresDatastore, name: str) -> str:
    positions = Positions(datastore.schema)
    with datastore.get_connection() as conn, conn.transaction():
        error = _stopped_at(positions, conn, name)
        positions.set_status(conn, name, "running")
        positions.record_intervention(conn, name, "retry", error["position"], {"error": error})
    log.warning("%s: operator asked to retry the event at position %d", name, error["position"])
    return f"{name}: will retry the event at position {error['position']}"
