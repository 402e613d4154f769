"""Where every follower stands, as PostgreSQL sees it right now: its position, lag and live owner.

A follower's row (``positions.py``) says what its last owner wrote; a process killed with
SIGKILL leaves ``running`` behind. So liveness is read from PostgreSQL itself: the session
that holds the follower's advisory lock (``lease.py``), found in ``pg_locks`` and
``pg_stat_activity``. A row that says ``running`` or ``retrying`` whose lock nobody holds is
``dead``; a follower with no row is ``never run``. Judging what is unhealthy is ``health.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.store import generations
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.store.schema import EVENTS_TABLE

NEVER_RUN, DEAD = "never run", "dead"
_OWNED = {"running", "retrying", "failed"}  # recorded statuses that a live lock holder keeps as they are
_WORKING = {"running", "retrying"}  # recorded statuses that claim a live owner

# The lease locks pg_try_advisory_lock(hashtext('commitline'), hashtext('<schema>/<name>')) (lease.py):
# the two-int4 form, shown in pg_locks as classid/objid with objsubid = 2. hashtext() is an int4 and
# classid/objid are oids; the int4 -> oid cast keeps the bits, so negative hashes match too.
_HOLDERS = SQL("""
SELECT DISTINCT ON (k.name) k.name, l.pid, a.application_name, a.backend_start, a.client_addr::text
FROM unnest(%(names)s::text[]) AS k(name)
JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
 AND l.classid = hashtext('commitline')::oid
 AND l.objid = hashtext(%(schema)s || '/' || k.name)::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
ORDER BY k.name, l.pid
""")

_LAG = SQL("""
SELECT count(*), (SELECT state FROM {events} WHERE notification_id > %(p)s ORDER BY notification_id LIMIT 1)
FROM {events} WHERE notification_id > %(p)s
""")


@dataclass(frozen=True)
class Backend:
    """The live PostgreSQL session holding a follower's lease."""

    pid: int
    application: str | None
    started_at: datetime | None
    client: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "application": self.application, "client": self.client,
                "started_at": self.started_at.isoformat() if self.started_at else None}


@dataclass(frozen=True)
class FollowerStatus:
    name: str
    status: str  # derived: running, retrying, failed, stopped, yielded, dead, never run
    owner: str | None  # the owner its row names (for a dead follower: the one it last had)
    position: int
    head: int
    lag_events: int
    lag_seconds: float
    updated_at: datetime | None
    error: dict[str, Any] | None
    recorded_status: str | None = None  # what the row says; None when it never ran
    backend: Backend | None = None  # the PostgreSQL session holding its lease now, if any
    last_moved_seconds: float | None = None  # since its row last changed (position, status or owner)
    process: dict[str, Any] | None = None  # the commitline process that owns it (host, pid, kind, started_at)
    #: the store generation its position was saved in, when older than the store's (``store new-generation`` ran
    #: since): it stops at its next round or start until an operator resets it; None otherwise
    older_generation: tuple[int, int] | None = None  # (saved in, the store's)

    @property
    def alive(self) -> bool:
        return self.backend is not None

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "alive": self.alive,
                "updated_at": self.updated_at.isoformat() if self.updated_at else None,
                "backend": self.backend.as_dict() if self.backend else None}


def derive_status(recorded: str | None, held: bool) -> str:
    """A follower's status from its row's status (None: no row) and whether a live session holds its lease."""
    if recorded is None:
        return "running" if held else NEVER_RUN  # held without a row: it is claiming it right now
    if held:
        return recorded if recorded in _OWNED else "running"
    return DEAD if recorded in _WORKING else recorded


def lease_holders(conn: Any, schema: str, names: list[str]) -> dict[str, Backend]:
    """The live session holding each named follower's lease, for those whose lease is held."""
    rows = conn.cursor(row_factory=tuple_row).execute(_HOLDERS, {"names": names, "schema": schema}).fetchall()
    return {name: Backend(pid, application, started, client) for name, pid, application, started, client in rows}


def follower_statuses(recorder: EventRecorder, known: Iterable[str] = (),
                      include: Callable[[str], bool] = lambda name: True) -> tuple[int, list[FollowerStatus]]:
    """The log head and the status of every ``known`` follower (in that order, ``never run`` if it never
    ran), then of every other follower that has a row (a rebuild, say) and that ``include`` accepts, by name."""
    schema = recorder.datastore.schema
    events = Identifier(schema, EVENTS_TABLE)
    with recorder.datastore.get_connection() as conn, conn.transaction():
        cur = conn.cursor(row_factory=tuple_row)
        # one snapshot for the head, the positions and the lags: read one by one while commands arrive, a position
        # could be past the head read before it, and a follower at the head show a lag
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        generation, head = generations.current_and_head(conn, schema)
        rows = Positions(schema).status_rows(conn)
        names = list(dict.fromkeys([*known, *(name for name in sorted(rows) if include(name))]))
        holders = lease_holders(conn, schema, names)
        lags = {position: _lag(cur, events, position)
                for position in {rows[n][1] if n in rows else 0 for n in names}}
    statuses = []
    for name in names:
        backend = holders.get(name)
        saved = None
        if name in rows:
            _, position, owner, recorded, error, updated_at, moved, process, saved = rows[name]
        else:
            position, owner, recorded, error, updated_at, moved, process = 0, None, None, None, None, None, None
        lag_events, lag_seconds = lags[position]
        statuses.append(FollowerStatus(name, derive_status(recorded, backend is not None), owner, position, head,
                                       lag_events, lag_seconds, updated_at, error, recorded, backend, moved, process,
                                       older_generation(saved, generation)))
    return head, statuses


def older_generation(saved: int | None, current: int) -> tuple[int, int] | None:
    """(saved, current) when a row's position was saved in an older generation than the store's; else None."""
    return (saved, current) if saved is not None and saved < current else None


def _lag(cur: Any, events: Identifier, position: int) -> tuple[int, float]:
    """(events after ``position``, age in seconds of the first of them)."""
    count, oldest = cur.execute(_LAG.format(events=events), {"p": position}).fetchone()
    if oldest is None:
        return count, 0.0
    recorded = datetime.fromisoformat(orjson.loads(bytes(oldest))["at"])
    return count, max(0.0, (datetime.now(timezone.utc) - recorded).total_seconds())
