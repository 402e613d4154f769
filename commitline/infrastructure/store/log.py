"""The gap-safe notification log of an events table: every read of it (the whole log, some topics, some
buckets) and the gap bookkeeping they share.

Notification ids come from a sequence (CACHE 1, so ids grow in the order they are drawn), but writers
run in parallel, without a table lock, and commit in any order: a reader can see id 12 while id 11 is
still uncommitted. Every read returns only what lies before the first gap not yet proven permanent:

- every writer assigns itself a transaction id *before* drawing notification ids;
- if a read at snapshot S1 sees id h but not g < h, then g was drawn before h, and h committed before
  S1, so the writer X of g had its xid before S1 and was either aborted or still running at S1;
- right after S1 the reader draws a fresh xid B in a throw-away transaction (rolled back: no commit
  record to flush). X's xid < B. (A snapshot's own xmax is no such bound: it is latestCompletedXid + 1,
  and a running writer may sit above it.)
- a later snapshot S2 with xmin(S2) >= B proves every xid below B has ended; if g is still absent in S2,
  X aborted and g will never appear, so the reader passes it.

Consequence: a follower never skips an event that commits late (the leapfrog problem), without
serialising writers. The cost, as in Emmett: a very long open transaction delays passing a gap (never
correctness). A gap proven for one reader is passed by all readers of the same ``NotificationLog``. Xids are
one server's: a follower joining again after a lost session forgets every gap (``forget_gaps``), as it may
be reading a promoted standby now, whose xids went back if it was asynchronous.

Filtered reads (by topic, by bucket) filter before the limit (a page of other events never hides a
matching one behind it) and still stop before any unproven gap below their last row, read in the same
statement (snapshot): the missing event might be one of those wanted.

Buckets divide the log by aggregate id, so that several instances of a follower (the Kafka publisher) can
work in parallel, each bucket owned by one of them (``followers/group.py``), while every aggregate's events
stay in one bucket. ``bucket_of`` is the same function in Python and in SQL (``bucket_sql``): the first four
bytes of the SHA-256 of the id's 16 bytes, big-endian, modulo the bucket count. It depends on nothing but
the id and the count, so it is stable across restarts, processes, machines, PostgreSQL and Python versions,
whatever the kind of UUID (a hash, not the id's own bits: uuid1 ids from one host share their last bytes).
``BucketLog.read`` reads a set of buckets (all those an instance publishes), each from its own position, in
one read, and says how far the log is proven read (``through``): past the page's last event when the page
is not full, up to the newest committed id (for some buckets: within the window of ids the read looked at),
so a bucket with no new events still moves on and its position is a true watermark. Reading every bucket needs no filter at all, so no hash is computed in SQL: rows are
assigned to buckets in Python (``bucket_of``, cached per aggregate id).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Protocol
from uuid import UUID

from eventsourcing.persistence import Notification
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.infrastructure.store.schema import EventTables

_MAX_TRACKED_GAPS = 100_000
_NO_STOP = 2**63 - 1
NOT_READ = 2**62  # the floor of a bucket left out of a read: no id is above it
#: Bucket numbers of recently seen aggregates (they repeat: a dict lookup instead of a SHA-256 per event).
_CACHE_SIZE = 100_000
_COLUMNS = "notification_id, originator_id, originator_version, topic, state"
# A scalar subquery (an InitPlan): the statement's snapshot is taken once per read, not once per row (measured:
# 0.55 -> 0.34 ms of server time for a page of 2,000 rows). Every row still carries it, so the rows and the xmin
# they are judged by come from one statement.
_XMIN = "(SELECT pg_snapshot_xmin(pg_current_snapshot())::text)"


def notification(originator_id: UUID, version: int, topic: str, state: bytes, nid: int) -> Notification:
    """``Notification(originator_id, version, topic, state, nid)``, equal to it, in a third of the time: its
    frozen dataclass ``__init__`` sets each field through ``object.__setattr__`` (0.65 µs, once per event on
    every follower's and rebuild's hot path); here the instance's dict is filled directly (0.25 µs)."""
    n = _new(Notification)
    d = n.__dict__
    d["originator_id"], d["originator_version"], d["topic"], d["state"], d["id"] = (
        originator_id, version, topic, state, nid)
    return n


_new = object.__new__


def first_id(start: int | None, inclusive_of_start: bool = True) -> int:
    """The first id a read from eventsourcing's ``start`` asks for (ids start at 1: nothing below can be missing)."""
    first = 1 if start is None else (start if inclusive_of_start else start + 1)
    return max(first, 1)


def gaps_in(ids: Iterable[int], first: int) -> list[int]:
    """The first missing id of each gap in ``ids`` (ascending), from ``first`` on."""
    gaps, expected = [], first
    for nid in ids:
        if nid != expected:
            gaps.append(expected)
        expected = nid + 1
    return gaps


@dataclass(frozen=True)
class Scan:
    """What ``NotificationLog.scan`` read."""

    notifications: list[Notification]  # in id order: the events of the types not passed over
    through: int  # every event with an id at or below this is in the scan or before it
    full: bool  # the scan met its limit: there may be more right away


class NotificationLog:
    """The gap-safe log of one events table: reads of all of it or of some topics, the newest id, and the
    gaps its readers have met (thread-safe)."""

    def __init__(self, tables: EventTables, connection: Callable[[], AbstractContextManager[Any]]):
        self.tables = tables
        self.connection = connection
        # first missing id of a gap -> an xid drawn just after the gap was first seen
        self._gaps: dict[int, int] = {}
        self._gaps_lock = threading.Lock()
        q = tables.sql
        self._assign_xid = q("SELECT pg_current_xact_id()::text")
        self._select = q(f"SELECT {_XMIN}, {_COLUMNS} FROM {{events}} "
                         "WHERE notification_id >= %s ORDER BY notification_id LIMIT %s")
        self._select_until = q(f"SELECT {_XMIN}, {_COLUMNS} FROM {{events}} "
                               "WHERE notification_id >= %s AND notification_id <= %s ORDER BY notification_id LIMIT %s")
        # A scan (``scan``), one statement (snapshot): the next rows, materialised once (a passed-over row's state
        # is never copied out of the table: NULL, as no stored state is); sent back are the rows not passed over
        # (kind 0, in id order), the gaps in the ids scanned (1), the last id scanned with the count (2). The
        # gaps are listed only when the count says there are some (a one-time filter): the window is costly.
        self._scan = q(
            "WITH scan AS MATERIALIZED (SELECT notification_id, originator_id, originator_version, topic, "
            " CASE WHEN topic = ANY(%(passed)s::text[]) THEN NULL ELSE state END AS state FROM {events} "
            " WHERE notification_id >= %(first)s ORDER BY notification_id LIMIT %(limit)s), "
            "ends AS MATERIALIZED (SELECT coalesce(max(notification_id), %(first)s::int8 - 1) AS last, "
            " count(*) AS scanned FROM scan) "
            f"SELECT 0, {_XMIN}, notification_id, originator_id, originator_version, topic, state FROM scan "
            " WHERE state IS NOT NULL "
            f"UNION ALL SELECT 1, {_XMIN}, prev + 1, NULL, NULL, NULL, NULL FROM (SELECT notification_id, "
            " lag(notification_id, 1, %(first)s::int8 - 1) OVER (ORDER BY notification_id) AS prev FROM scan "
            " WHERE (SELECT last - %(first)s::int8 + 1 <> scanned FROM ends)) AS ids WHERE notification_id > prev + 1 "
            f"UNION ALL SELECT 2, {_XMIN}, last, NULL, scanned::int4, NULL, NULL FROM ends")
        # The first rows of the wanted topics, and every gap in the ids up to the last of them, in one snapshot.
        self._select_of_topics = q(
            f"WITH page AS (SELECT {_COLUMNS} FROM {{events}} "
            "WHERE notification_id >= %(first)s AND notification_id <= %(stop)s AND topic = ANY(%(topics)s::text[]) "
            "ORDER BY notification_id LIMIT %(limit)s), "
            "span AS (SELECT notification_id, lag(notification_id, 1, %(first)s::int8 - 1) "
            "OVER (ORDER BY notification_id) AS prev FROM {events} "
            "WHERE notification_id >= %(first)s AND notification_id <= (SELECT max(notification_id) FROM page)) "
            f"SELECT {_XMIN}, false, {_COLUMNS} FROM page UNION ALL "
            f"SELECT {_XMIN}, true, prev + 1, NULL, NULL, NULL, NULL "
            "FROM span WHERE notification_id > prev + 1"
        )
        self._max_id = q("SELECT max(notification_id) FROM {events}")

    def read(self, first: int, limit: int, stop: int | None = None,
             topics: Sequence[str] = ()) -> tuple[list[Notification], int | None]:
        """Up to ``limit`` notifications from id ``first`` (up to ``stop``; of ``topics`` only, if given) in id
        order, ending before any gap not yet proven permanent; and that gap's id (None if none ended the read)."""
        if topics:
            return self._read_topics(first, limit, stop, list(topics))
        if stop is not None:
            statement, params = self._select_until, (first, stop, limit)
        else:
            statement, params = self._select, (first, limit)
        with self.connection() as conn:
            # One statement, one snapshot: the rows and the xmin they are judged by agree.
            rows = conn.cursor(row_factory=tuple_row).execute(statement, params, prepare=True).fetchall()
        # Every gap of the page is judged at once (each noted gap's proof starts now), only when there is one.
        cutoff = None
        if rows and rows[-1][1] - first + 1 != len(rows):
            cutoff = self.first_unproven_gap(gaps_in((row[1] for row in rows), first), int(rows[0][0]))
        page: list[Notification] = []
        for _, nid, originator_id, version, topic, state in rows:
            if cutoff is not None and nid >= cutoff:
                break
            page.append(notification(originator_id, version, topic, b"" if state is None else bytes(state), nid))
        return page, cutoff

    def _read_topics(self, first: int, limit: int, stop: int | None,
                     topics: list[str]) -> tuple[list[Notification], int | None]:
        """The page of matching rows and, in the same statement (snapshot), the gaps below its last row."""
        with self.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._select_of_topics,
                {"first": first, "stop": _NO_STOP if stop is None else stop, "topics": topics, "limit": limit},
                prepare=True).fetchall()
        if not rows:
            return [], None
        cutoff = self.first_unproven_gap([row[2] for row in rows if row[1]], int(rows[0][0]))
        page = sorted((row[2:] for row in rows if not row[1]), key=lambda row: row[0])
        return _notifications(page, cutoff), cutoff

    def scan(self, first: int, limit: int, passed_over: Sequence[str]) -> Scan:
        """The next ``limit`` events of the log from id ``first``, as a rebuild passes over them: those of the
        types in ``passed_over`` are looked at but not returned (no row, no object, no state: a rebuild of one
        read model handles a fraction of the log), the others are, in id order; ``through`` is how far the log
        is proven read, ending before any gap not yet proven permanent, as ``read`` does."""
        with self.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._scan, {"passed": list(passed_over), "first": first, "limit": limit}, prepare=True).fetchall()
        events, gaps, last, scanned, xmin = [], [], first - 1, 0, 0
        for kind, xmin, nid, originator_id, version, topic, state in rows:
            if kind == 0:
                events.append((nid, originator_id, version, topic, state))
            elif kind == 1:
                gaps.append(nid)
            else:
                last, scanned = nid, version
        events.sort(key=itemgetter(0))  # in id order as scanned; the statement has no ORDER BY, so not relied on
        cutoff = self.first_unproven_gap(gaps, int(xmin)) if gaps else None
        page = _notifications(events, cutoff)
        if cutoff is not None:
            return Scan(page, cutoff - 1, full=False)
        return Scan(page, last, full=scanned >= limit)

    def max_id(self) -> int | None:
        with self.connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(self._max_id).fetchone()
        return row[0] if row else None

    def first_unproven_gap(self, gaps: Sequence[int], xmin: int) -> int | None:
        """The first of ``gaps`` (first missing ids below a read's last row, read in the same snapshot, whose
        xmin is ``xmin``) not yet proven permanent, which the read must stop before; None when every one may
        be passed. The gaps seen for the first time are noted with one fresh xid: their proofs start now, all
        of them (each was missing below a row the snapshot saw), so the next read passes every one of them at
        once instead of one per read (a log written under contention has a gap every few events)."""
        cutoff, new = None, []
        with self._gaps_lock:
            # A gap passed stays noted: xmin only grows, so its proof holds for every later read too.
            for gap in sorted(gaps):
                bound = self._gaps.get(gap)
                if bound is None:
                    new.append(gap)
                if cutoff is None and (bound is None or xmin < bound):
                    cutoff = gap
        if new:
            self._note_gaps(new)
        return cutoff

    def _note_gaps(self, gaps: Sequence[int]) -> None:
        bound = self._fresh_xid()
        with self._gaps_lock:
            for gap in gaps:
                self._gaps.setdefault(gap, bound)
            if len(self._gaps) > _MAX_TRACKED_GAPS:  # forget the oldest; a re-sighting only costs a poll
                for old in sorted(self._gaps)[: len(self._gaps) - _MAX_TRACKED_GAPS]:
                    del self._gaps[old]

    def _fresh_xid(self) -> int:
        with self.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            with conn.transaction(force_rollback=True):
                cur.execute(self._assign_xid)
                return int(cur.fetchone()[0])  # type: ignore[index]

    def forget_gaps(self) -> None:
        """Forget every gap met and its proof's bound: a follower joining again after a lost session may now
        read another server (a promoted standby), whose xids are not those the bounds were drawn from (they
        went back with an asynchronous standby: a bound from the old server would hold a gap for as long as
        the new one takes to reach it, or pass one a writer there still fills). A gap met again is proven anew."""
        with self._gaps_lock:
            self._gaps.clear()

    def gaps_seen(self) -> set[int]:
        """First ids of the gaps readers of this log have met (open or proven aborted): diagnostics."""
        with self._gaps_lock:
            return set(self._gaps)


def _notifications(rows: Iterable[Sequence[Any]], cutoff: int | None) -> list[Notification]:
    """Notifications of ``rows`` (id, aggregate id, version, topic, state; in id order) before ``cutoff``."""
    page = []
    for nid, originator_id, version, topic, state in rows:
        if cutoff is not None and nid >= cutoff:
            break
        page.append(notification(originator_id, version, topic, bytes(state), nid))
    return page


# -- buckets ----------------------------------------------------------------------


def bucket_of(aggregate_id: UUID, buckets: int) -> int:
    return int.from_bytes(hashlib.sha256(aggregate_id.bytes).digest()[:4], "big") % buckets


def bucket_sql(column: str = "originator_id") -> Composed:
    """``bucket_of`` in SQL, of a uuid ``column``, with the count as the parameter ``%(buckets)s``."""
    return SQL("((('x' || encode(substr(sha256(uuid_send({})), 1, 4), 'hex'))::bit(32)::bigint %% %(buckets)s)::int)"
               ).format(Identifier(column))


def bucket_positions_sql(schema: str) -> Composed:
    """For each (bucket, position) of ``%(bucket_list)s``/``%(positions)s`` (of ``%(buckets)s`` buckets): the
    count of the bucket's events after the position and the id of the first of them, in one scan (status lag)."""
    return EventTables(schema).sql(
        "WITH p AS (SELECT * FROM unnest(%(bucket_list)s::int[], %(positions)s::int8[]) AS p(bucket, position)), "
        "e AS (SELECT notification_id, {bucket} AS bucket FROM {events} "
        " WHERE notification_id > (SELECT coalesce(min(position), 0) FROM p)) "
        "SELECT p.bucket, count(e.notification_id), min(e.notification_id) FROM p "
        "LEFT JOIN e ON e.bucket = p.bucket AND e.notification_id > p.position GROUP BY p.bucket", bucket=bucket_sql())


@dataclass(frozen=True)
class BucketPage:
    notifications: list[Notification]  # in id order
    buckets: list[int]  # the bucket of each notification
    through: int  # every event of the buckets read with an id at or below this is in the page or before it
    full: bool = False  # the read hit its limit: there may be more right away


class Logged(Protocol):
    """What has a notification log (the recorder)."""

    log: NotificationLog


class BucketLog:
    """The gap-safe log of commitline's events table, for any set of buckets at once, each from its own
    position (thread-safe). It shares the recorder's ``NotificationLog`` gap bookkeeping."""

    def __init__(self, recorder: Logged, buckets: int):
        self.log = recorder.log
        self.buckets = buckets
        self._bucket_of: dict[int, int] = {}
        q = self.log.tables.sql
        # Some buckets: one statement, one snapshot: the page, every gap up to its end, the end, the log's head
        # and the xmin judging them. A bucket's floor is its position (NOT_READ for a bucket not read): the
        # filter, before the limit, is the one hash per row computed in SQL. The read looks at ids up to
        # ``stop`` only: the planner may scan (and hash) every row the filter could match before sorting for
        # the limit (a bitmap scan), so without a bound each read would cost as much as the rest of the log.
        # ``edge`` is a stored row's id, so every missing id up to it shows as a gap: the page's last row when it
        # is full, else the window's last row, else (an empty window) the first row after it.
        self._read_some = q(
            f"WITH page AS (SELECT {_COLUMNS} FROM {{events}} "
            " WHERE notification_id >= %(first)s AND notification_id <= %(stop)s "
            " AND notification_id > (%(floors)s::int8[])[{bucket} + 1] "
            " ORDER BY notification_id LIMIT %(limit)s), "
            "edge AS (SELECT CASE WHEN (SELECT count(*) FROM page) >= %(limit)s THEN (SELECT max(notification_id) "
            " FROM page) ELSE coalesce((SELECT max(notification_id) FROM {events} WHERE notification_id >= %(first)s "
            " AND notification_id <= %(stop)s), (SELECT min(notification_id) FROM {events} "
            " WHERE notification_id > %(stop)s), %(first)s::int8 - 1) END AS id), "
            "span AS (SELECT notification_id, lag(notification_id, 1, %(first)s::int8 - 1) "
            " OVER (ORDER BY notification_id) AS prev FROM {events} "
            " WHERE notification_id >= %(first)s AND notification_id <= (SELECT id FROM edge)) "
            f"SELECT 0, {_XMIN}, {_COLUMNS} FROM page "
            f"UNION ALL SELECT 1, {_XMIN}, prev + 1, NULL, NULL, NULL, NULL "
            " FROM span WHERE notification_id > prev + 1 "
            f"UNION ALL SELECT 2, {_XMIN}, (SELECT id FROM edge), NULL, NULL, NULL, NULL "
            f"UNION ALL SELECT 3, {_XMIN}, coalesce((SELECT max(notification_id) FROM {{events}}), 0), "
            " NULL, NULL, NULL, NULL",
            bucket=bucket_sql())
        # Every bucket: no filter and no hash in SQL; the page itself shows every gap up to its end.
        self._read_all = q(f"SELECT {_XMIN}, {_COLUMNS} FROM {{events}} WHERE notification_id >= %(first)s "
                           "ORDER BY notification_id LIMIT %(limit)s")

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
        is proven read for all of them (from the lowest position on). A read of some buckets looks at a
        window of ids (about ``limit`` of theirs), so its page may hold fewer than ``limit`` events while more
        follow: ``full`` says whether to read on at once."""
        first = max(min(positions.values()) + 1, 1)
        floors = [positions.get(b, NOT_READ) for b in range(self.buckets)]
        if len(positions) == self.buckets:
            return self._read_every_bucket(first, floors, limit)
        # Ids up to ``stop``: as many as hold about ``limit`` events of these buckets (hashes spread evenly).
        stop = first - 1 + limit * max(1, self.buckets // len(positions))
        with self.log.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._read_some, {"first": first, "stop": stop, "limit": limit, "floors": floors,
                                  "buckets": self.buckets}, prepare=True).fetchall()
        xmin = int(rows[0][1])
        edge = next(row[2] for row in rows if row[0] == 2)
        head = next(row[2] for row in rows if row[0] == 3)
        # Past the window, the edge is the first row after it: not read, so proven up to just before it.
        top = edge if edge <= stop else edge - 1
        cutoff = self.log.first_unproven_gap([row[2] for row in rows if row[0] == 1], xmin)
        through = top if cutoff is None else min(top, cutoff - 1)
        read = [row[2:] for row in rows if row[0] == 0]
        read.sort(key=lambda row: row[0])
        # Full also when the window ended the read while the log goes on: read on at once.
        full = len(read) >= limit or (cutoff is None and head > top)
        return self._page(read, cutoff, floors, max(through, first - 1), full)

    def _read_every_bucket(self, first: int, floors: list[int], limit: int) -> BucketPage:
        with self.log.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._read_all, {"first": first, "limit": limit}, prepare=True).fetchall()
        if not rows:
            return BucketPage([], [], first - 1)
        gaps = gaps_in((row[1] for row in rows), first)
        cutoff = self.log.first_unproven_gap(gaps, int(rows[0][0])) if gaps else None
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
            page.append(notification(originator_id, version, topic, bytes(state), nid))
            buckets.append(bucket)
        return BucketPage(page, buckets, through, full)
