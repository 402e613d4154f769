"""Where every follower stands: position, the log head, and the lag in events and seconds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.store.recorder import EVENTS_TABLE, EventRecorder


@dataclass(frozen=True)
class FollowerStatus:
    name: str
    status: str
    owner: str | None
    position: int
    head: int
    lag_events: int
    lag_seconds: float
    updated_at: datetime
    error: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "updated_at": self.updated_at.isoformat()}


def follower_statuses(recorder: EventRecorder) -> tuple[int, list[FollowerStatus]]:
    """The log head and the status of every follower that has ever run."""
    schema = recorder.datastore.schema
    events = Identifier(schema, EVENTS_TABLE)
    with recorder.datastore.get_connection() as conn:
        cur = conn.cursor(row_factory=tuple_row)
        head = cur.execute(SQL("SELECT coalesce(max(notification_id), 0) FROM {}").format(events)).fetchone()[0]
        statuses = []
        for row in Positions(schema).all(conn):
            lag, oldest = cur.execute(SQL(
                "SELECT count(*), (SELECT state FROM {events} WHERE notification_id > %(p)s "
                "ORDER BY notification_id LIMIT 1) FROM {events} WHERE notification_id > %(p)s"
            ).format(events=events), {"p": row.position}).fetchone()
            lag_seconds = 0.0
            if oldest is not None:
                recorded = datetime.fromisoformat(orjson.loads(bytes(oldest))["at"])
                lag_seconds = max(0.0, (datetime.now(timezone.utc) - recorded).total_seconds())
            statuses.append(FollowerStatus(row.name, row.status, row.owner, row.position, head, lag, lag_seconds,
                                           row.updated_at, row.error))
    return head, statuses

