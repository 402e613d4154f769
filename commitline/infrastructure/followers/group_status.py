"""Where a follower group stands (the Kafka publisher's buckets), as PostgreSQL sees it now: each live
instance (a session holding the group's membership lock, ``group.py``) with the buckets it owns, and
each bucket with its owner, position and lag (events of that bucket after its position, and the age of
the first of them). Liveness follows ``status.py``'s rules: only locks held by live sessions count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import orjson
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.followers.buckets import bucket_name, parse_bucket_name, sequence_of
from commitline.infrastructure.followers.group import MEMBER_COUNTS
from commitline.infrastructure.followers.positions import POSITIONS_TABLE, Positions
from commitline.infrastructure.followers.status import (
    NEVER_RUN,
    Backend,
    FollowerStatus,
    derive_status,
    lease_holders,
    older_generation,
)
from commitline.infrastructure.store import generations
from commitline.infrastructure.store.log import bucket_positions_sql
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.store.schema import EVENTS_TABLE

_MEMBERS = SQL("""
SELECT l.pid, a.application_name, a.backend_start, a.client_addr::text
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
 AND l.classid = hashtext(%(count_key)s)::oid AND l.objid = %(count)s::int4::oid
ORDER BY l.pid
""")


@dataclass(frozen=True)
class Member:
    """A live instance of the group: its session, the owner name it writes, and the buckets it owns."""

    backend: Backend
    owner: str | None
    buckets: list[int]
    process: dict[str, Any] | None = None  # the commitline process (host, pid, kind, started_at), once it owns one

    def as_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, **self.backend.as_dict(), "buckets": self.buckets, "process": self.process}


@dataclass(frozen=True)
class GroupStatus:
    name: str
    bucket_count: int
    members: list[Member]
    buckets: list[FollowerStatus]  # one per bucket, in bucket order; backend = the session owning it

    @property
    def unowned(self) -> list[int]:
        return [b for b, s in enumerate(self.buckets) if s.backend is None]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bucket_count": self.bucket_count,
                "instances": [m.as_dict() for m in self.members], "unowned": self.unowned,
                "buckets": [{**s.as_dict(), "bucket": b} for b, s in enumerate(self.buckets)]}

    def describe(self, member: Member) -> str:
        return self.describe_buckets(member.buckets)

    @staticmethod
    def describe_buckets(buckets: list[int]) -> str:
        return f"{sequence_of(buckets)} ({len(buckets)})" if buckets else "none"


#: The bucket rows of the group, for the count they were written with and when.
_BUCKET_ROWS = SQL("SELECT name, updated_at FROM {} WHERE starts_with(name, %s)")


def count_in_use(conn: Any, schema: str, name: str, configured: int) -> int:
    """The bucket count the group's instances use: that of its live members (the one most of them use, should
    they disagree), else that of its most recently written bucket rows, else ``configured`` (this process's
    ``COMMITLINE_PUBLISH_BUCKETS``, which need not be the running instances' after a change of it)."""
    cur = conn.cursor(row_factory=tuple_row)
    live = {int(count) for _, count in cur.execute(MEMBER_COUNTS, {"count_key": f"{schema}/{name}@buckets"})}
    if live:
        return configured if configured in live else max(live)
    latest: dict[int, Any] = {}
    for row_name, updated_at in cur.execute(_BUCKET_ROWS.format(Identifier(schema, POSITIONS_TABLE)),
                                            (f"{name}/",)):
        parsed = parse_bucket_name(row_name)
        if parsed is not None and parsed.group == name and updated_at is not None:
            latest[parsed.buckets] = max(latest.get(parsed.buckets, updated_at), updated_at)
    return max(latest, key=latest.__getitem__) if latest else configured


def group_status(recorder: EventRecorder, name: str, configured_count: int, head: int) -> GroupStatus:
    """Where the group ``name`` stands, with the bucket count its instances use (``count_in_use``)."""
    schema = recorder.datastore.schema
    with recorder.datastore.get_connection() as conn:
        bucket_count = count_in_use(conn, schema, name, configured_count)
        names = [bucket_name(name, b, bucket_count) for b in range(bucket_count)]
        cur = conn.cursor(row_factory=tuple_row)
        members = cur.execute(_MEMBERS, {"count_key": f"{schema}/{name}@buckets", "count": bucket_count}).fetchall()
        rows = Positions(schema).status_rows(conn, [*names, name])
        generation, _ = generations.current_and_head(conn, schema)
        holders = lease_holders(conn, schema, names)
        start = rows[name][1] if name in rows else 0  # where a bucket without a row will start
        positions = [rows[n][1] if n in rows else start for n in names]
        lags = {bucket: (count, first) for bucket, count, first in cur.execute(
            bucket_positions_sql(schema),
            {"bucket_list": list(range(bucket_count)), "positions": positions, "buckets": bucket_count}).fetchall()}
        firsts = [first for _, first in lags.values() if first is not None]
        states = dict(cur.execute(SQL("SELECT notification_id, state FROM {} WHERE notification_id = ANY(%s)").format(
            Identifier(schema, EVENTS_TABLE)), (firsts,)).fetchall()) if firsts else {}
    now = datetime.now(timezone.utc)
    buckets = []
    for b, n in enumerate(names):
        count, first = lags.get(b, (0, None))
        age = 0.0
        if first is not None and first in states:
            age = max(0.0, (now - datetime.fromisoformat(orjson.loads(bytes(states[first]))["at"])).total_seconds())
        backend = holders.get(n)
        saved = None
        if n in rows:
            _, position, owner, recorded, error, updated_at, moved, process, saved = rows[n]
        else:
            position, owner, recorded, error, updated_at, moved, process = start, None, None, None, None, None, None
        status = derive_status(recorded, backend is not None) if recorded is not None or backend else NEVER_RUN
        buckets.append(FollowerStatus(n, status, owner, position, head, count, age, updated_at, error, recorded,
                                      backend, moved, process, older_generation(saved, generation)))
    group_members = []
    for pid, application, started, client in members:
        owned = [b for b, s in enumerate(buckets) if s.backend is not None and s.backend.pid == pid]
        prefix = f"commitline {name} "  # the member connection's application name, unless the URL sets one
        owner = next((buckets[b].owner for b in owned if buckets[b].owner),
                     application[len(prefix):] if application and application.startswith(prefix) else None)
        process = next((buckets[b].process for b in owned if buckets[b].process), None)
        group_members.append(Member(Backend(pid, application, started, client), owner, owned, process))
    return GroupStatus(name, bucket_count, group_members, buckets)


def with_buckets_figures(row: FollowerStatus, group: GroupStatus) -> FollowerStatus:
    """The group's own row (``row``) with the position and lag its buckets have now: the lowest bucket position,
    the events waiting in any bucket and the oldest of them. The row is written by the owner of bucket 0 as it
    goes, so after that owner is killed it lags until the next one writes it, and would overstate the lag."""
    if not any(b.recorded_status is not None for b in group.buckets):
        return row
    return replace(row, position=min(b.position for b in group.buckets),
                   lag_events=sum(b.lag_events for b in group.buckets),
                   lag_seconds=max(b.lag_seconds for b in group.buckets))
