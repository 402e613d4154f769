"""Buckets of aggregates: which bucket an aggregate belongs to, and the gap-safe log of a set of buckets.

The log is divided into a fixed number of buckets by aggregate id, so that several instances of a
follower (the Kafka publisher) can work in parallel, each bucket owned by one of them
(``group.py``), while every aggregate's events stay in one bucket and so in one owner's hands.

``bucket_of`` is the same function in Python and in SQL (``bucket_sql``): the first four bytes of the
SHA-256 of the id's 16 bytes, big-endian, modulo the bucket count. It depends on nothing but the id and
the count, so it is stable across restarts, processes, machines, PostgreSQL and Python versions,
whatever the kind of UUID (a hash, not the id's own bits: uuid1 ids from one host share their last bytes).

``BucketLog.read`` is the notification log of a set of buckets (all those an instance publishes), each
from its own position, in one read: with the no-leapfrog guarantee of ``store/recorder.py`` (whose gap
bookkeeping it shares: ``first_unproven_gap``): the filter is applied before the limit, and the page
stops before any gap below its end that is not yet proven permanent (the missing event might be of one
of these buckets). It also says how far the log is proven read (``through``): past the page's last event
when the page is not full, up to the newest committed id, so a bucket with no new events still moves on
and its position is a true watermark (every event of the bucket at or below it was handled). Reading
every bucket needs no filter at all, so no hash is computed in SQL: rows are assigned to buckets in
Python (``bucket_of``, cached per aggregate id).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Notification
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.infrastructure.store.recorder import EVENTS_TABLE, EventRecorder


def bucket_of(aggregate_id: UUID, buckets: int) -> int:
    return int.from_bytes(hashlib.sha256(aggregate_id.bytes).digest()[:4], "big") % buckets


def bucket_sql(column: str = "originator_id") -> Composed:
    """``bucket_of`` in SQL, of a uuid ``column``, with the count as the parameter ``%(buckets)s``."""
    return SQL("((('x' || encode(substr(sha256(uuid_send({})), 1, 4), 'hex'))::bit(32)::bigint %% %(buckets)s)::int)"
               ).format(Identifier(column))


def bucket_name(group: str, bucket: int, buckets: int) -> str:
    """The follower name of one bucket, e.g. ``kafka-publisher/07of16``: with the count, so that buckets of
    another count (another deployment's setting) never reuse its row."""
    return f"{group}/{bucket:0{len(str(buckets - 1))}d}of{buckets}"


_NAME = re.compile(r"^(?P<group>.+)/(?P<bucket>\d+)of(?P<buckets>\d+)$")


@dataclass(frozen=True)
class BucketName:
    group: str
    bucket: int
    buckets: int


def parse_bucket_name(name: str) -> BucketName | None:
    """The group, bucket and count of a bucket's follower name; None for any other name."""
    m = _NAME.match(name)
    return BucketName(m["group"], int(m["bucket"]), int(m["buckets"])) if m else None


@dataclass(frozen=True)
class BucketPage:
    notifications: list[Notification]  # in id order
    buckets: list[int]  # the bucket of each notification
    through: int  # every event of the buckets read with an id at or below this is in the page or before it
    full: bool = False  # the read hit its limit: there may be more right away


NOT_READ = 2**62  # the floor of a bucket left out of a read: no id is above it

#: Bucket numbers of recently seen aggregates (they repeat: a dict lookup instead of a SHA-256 per event).
_CACHE_SIZE = 100_000


class BucketLog:
    """The gap-safe notification log of commitline's events table, for any set of buckets at once, each
    from its own position (thread-safe)."""

    def __init__(self, recorder: EventRecorder, buckets: int):
        self.recorder = recorder
        self.datastore = recorder.datastore
        self.buckets = buckets
        self._bucket_of: dict[int, int] = {}
        events = Identifier(recorder.datastore.schema, EVENTS_TABLE)
        # Some buckets: one statement, one snapshot: the page, every gap up to its end, the end, and the xmin
        # judging them. A bucket's floor is its position (NOT_READ for a bucket not read): the filter, before
        # the limit, is the one hash per row computed in SQL.
        self._read_some = SQL(
            "WITH page AS (SELECT notification_id, originator_id, originator_version, topic, state FROM {events} "
            " WHERE notification_id >= %(first)s AND notification_id > (%(floors)s::int8[])[{bucket} + 1] "
            " ORDER BY notification_id LIMIT %(limit)s), "
            "top AS (SELECT CASE WHEN (SELECT count(*) FROM page) >= %(limit)s THEN (SELECT max(notification_id) "
            " FROM page) ELSE (SELECT max(notification_id) FROM {events}) END AS id), "
            "span AS (SELECT notification_id, lag(notification_id, 1, %(first)s::int8 - 1) "
            " OVER (ORDER BY notification_id) AS prev FROM {events} "
            " WHERE notification_id >= %(first)s AND notification_id <= (SELECT id FROM top)) "
            "SELECT 0, pg_snapshot_xmin(pg_current_snapshot())::text, notification_id, originator_id, "
            " originator_version, topic, state FROM page "
            "UNION ALL SELECT 1, pg_snapshot_xmin(pg_current_snapshot())::text, prev + 1, NULL, NULL, NULL, NULL "
            " FROM span WHERE notification_id > prev + 1 "
            "UNION ALL SELECT 2, pg_snapshot_xmin(pg_current_snapshot())::text, coalesce((SELECT id FROM top), 0), "
            " NULL, NULL, NULL, NULL"
        ).format(events=events, bucket=bucket_sql())
        # Every bucket: no filter and no hash in SQL; the page itself shows every gap up to its end.
        self._read_all = SQL(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text, notification_id, originator_id, "
            "originator_version, topic, state FROM {events} WHERE notification_id >= %(first)s "
            "ORDER BY notification_id LIMIT %(limit)s").format(events=events)

    def bucket_of(self, aggregate_id: UUID) -> int:
        key = aggregate_id.int  # hashed in C, unlike the UUID
        bucket = self._bucket_of.get(key)
        if bucket is None:
            if len(self._bucket_of) >= _CACHE_SIZE:
                self._bucket_of.clear()
            bucket = self._bucket_of[key] = bucket_of(aggregate_id, self.buckets)
        return bucket

    def read(self, positions: Mapping[int, int], limit: int) -> BucketPage:
        """Up to ``limit`` events of the buckets of ``positions`` (bucket -> position), each after its
        bucket's position, in id order, ending before any gap not yet proven permanent; and how far the log
        is proven read for all of them (from the lowest position on)."""
        first = max(min(positions.values()) + 1, 1)
        floors = [positions.get(b, NOT_READ) for b in range(self.buckets)]
        if len(positions) == self.buckets:
            return self._read_every_bucket(first, floors, limit)
        with self.datastore.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._read_some, {"first": first, "limit": limit, "floors": floors, "buckets": self.buckets},
                prepare=True).fetchall()
        xmin = int(rows[0][1])
        top = next(row[2] for row in rows if row[0] == 2)
        cutoff = self.recorder.first_unproven_gap([row[2] for row in rows if row[0] == 1], xmin)
        through = top if cutoff is None else min(top, cutoff - 1)
        read = [row[2:] for row in rows if row[0] == 0]
        read.sort(key=lambda row: row[0])
        return self._page(read, cutoff, floors, max(through, first - 1), len(read) >= limit)

    def _read_every_bucket(self, first: int, floors: list[int], limit: int) -> BucketPage:
        with self.datastore.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._read_all, {"first": first, "limit": limit}, prepare=True).fetchall()
        if not rows:
            return BucketPage([], [], first - 1)
        gaps, expected = [], first
        for row in rows:
            if row[1] != expected:
                gaps.append(expected)
            expected = row[1] + 1
        cutoff = self.recorder.first_unproven_gap(gaps, int(rows[0][0])) if gaps else None
        # Not full: every committed event from ``first`` on is in the page, so the last one is the log's end.
        through = rows[-1][1] if cutoff is None else cutoff - 1
        return self._page([row[1:] for row in rows], cutoff, floors, through, len(rows) >= limit)

    def _page(self, rows: list[Any], cutoff: int | None, floors: list[int], through: int, full: bool) -> BucketPage:
        """The page of ``rows`` (id, aggregate id, version, topic, state; in id order) before ``cutoff``, without
        the rows at or below their bucket's floor."""
        page, buckets = [], []
        bucket_of_ = self.bucket_of
        for nid, originator_id, version, topic, state in rows:
            if cutoff is not None and nid >= cutoff:
                break
            bucket = bucket_of_(originator_id)
            if nid <= floors[bucket]:
                continue  # already published by its bucket (or a bucket not read)
            page.append(Notification(id=nid, originator_id=originator_id, originator_version=version, topic=topic,
                                     state=bytes(state)))
            buckets.append(bucket)
        return BucketPage(page, buckets, through, full)


def bucket_positions_sql(schema: str) -> Composed:
    """For each (bucket, position) of ``%(bucket_list)s``/``%(positions)s`` (of ``%(buckets)s`` buckets): the
    count of the bucket's events after the position and the id of the first of them, in one scan (status lag)."""
    return SQL(
        "WITH p AS (SELECT * FROM unnest(%(bucket_list)s::int[], %(positions)s::int8[]) AS p(bucket, position)), "
        "e AS (SELECT notification_id, {bucket} AS bucket FROM {events} "
        " WHERE notification_id > (SELECT coalesce(min(position), 0) FROM p)) "
        "SELECT p.bucket, count(e.notification_id), min(e.notification_id) FROM p "
        "LEFT JOIN e ON e.bucket = p.bucket AND e.notification_id > p.position GROUP BY p.bucket"
    ).format(bucket=bucket_sql(), events=Identifier(schema, EVENTS_TABLE))


def sequence_of(ids: Sequence[int]) -> str:
    """Bucket numbers for people: ``0-3,7,9-10``."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
