"""A group of follower instances sharing buckets: membership, fair shares and bucket ownership, all
as PostgreSQL advisory locks held on one connection per instance.

- **Membership.** A member holds the group's lock *shared*: the same key as the lease of a follower
  without buckets (``lease.py``), so an older single-instance publisher (which takes it exclusively)
  and a group never publish at the same time. The live members are the sessions holding it, read
  from ``pg_locks``: a dead process's session ends and its locks vanish, so nothing a dead instance
  wrote can make it look alive. Members also hold a shared lock whose second key is their bucket
  count, and refuse to work beside members of another count (they would own different buckets).
- **Buckets.** Each bucket is the exclusive advisory lock of its follower name (``buckets.bucket_name``,
  the key a ``Lease`` of that name would take, so ``status.lease_holders`` finds its owner), taken on
  the member's connection. Its row's position is written on that connection too (``save``, many at once),
  so a member that lost its session cannot move a bucket it no longer owns.
- **Fair share.** With M live members (sorted by backend pid) and B buckets, the first B mod M own
  ceil(B/M) buckets and the others floor(B/M): every member computes the same targets from
  ``pg_locks`` alone. Rebalancing is the caller's loop (``kafka/partitioned.py``).
- **Summary row.** The group's own row (e.g. ``kafka-publisher``) is kept by the owner of bucket 0:
  its position is the lowest bucket position (every event at or below it has been handled by its
  bucket), its status ``failed``/``retrying`` with that bucket's error while any bucket is. A bucket
  that has no row yet starts from it (``Positions.claim``), as it did from the single publisher's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.followers.buckets import bucket_name
from commitline.infrastructure.followers.lease import LeaseLost
from commitline.infrastructure.followers.positions import POSITIONS_TABLE, Positions
from commitline.infrastructure.followers.status import lease_holders
from commitline.infrastructure.store.datastore import connect_options, store_failures

log = logging.getLogger(__name__)
T = TypeVar("T")

_MEMBERS = SQL(
    "SELECT l.pid, l.objid::int8 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid = hashtext(%(count_key)s)::oid")


def fair_share(buckets: int, members: list[int], member: int) -> int:
    """How many of ``buckets`` the member ``member`` of ``members`` (backend pids) should own."""
    base, extra = divmod(buckets, len(members))
    return base + (1 if sorted(members).index(member) < extra else 0)


@dataclass(frozen=True)
class GroupState:
    members: list[int]  # live members' backend pids, sorted
    owners: dict[int, int]  # bucket -> backend pid holding it
    me: int  # this member's backend pid

    def share(self, buckets: int, member: int | None = None) -> int:
        return fair_share(buckets, self.members, self.me if member is None else member)

    def owned_by(self, member: int) -> set[int]:
        return {b for b, pid in self.owners.items() if pid == member}


class GroupLease:
    """One instance's membership of the group ``name`` and the buckets it owns (thread-safe: every call
    runs on the one connection under a lock)."""

    def __init__(self, conninfo: dict[str, Any], schema: str, name: str, buckets: int, owner: str):
        self.conninfo = conninfo
        self.schema = schema
        self.name = name
        self.buckets = buckets
        self.owner = owner
        self.positions = Positions(schema)
        self.names = [bucket_name(name, b, buckets) for b in range(buckets)]
        self._member_key = f"{schema}/{name}"
        self._count_key = f"{schema}/{name}@buckets"
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._owned: set[int] = set()
        self.pid = 0

    @property
    def joined(self) -> bool:
        return self._conn is not None and self.pid != 0

    def owns(self, bucket: int) -> bool:
        return self.joined and bucket in self._owned

    def join(self) -> str | None:
        """Become a member; None when joined, else why not yet (the caller tries again later)."""
        with self._lock, store_failures(self.conninfo, lambda _: self._drop()):
            if self.joined:
                return None
            self._conn = psycopg.connect(**connect_options(
                self.conninfo, connect_timeout=10, keepalives=1, keepalives_idle=5, keepalives_interval=2,
                keepalives_count=3, fallback_application_name=f"commitline {self.name} {self.owner}"[:63]),
                autocommit=True)
            cur = self._conn.cursor(row_factory=tuple_row)
            if not cur.execute("SELECT pg_try_advisory_lock_shared(hashtext('commitline'), hashtext(%s))",
                               (self._member_key,)).fetchone()[0]:
                self._drop()
                return f"another instance holds {self.name} alone (a commitline publishing without buckets)"
            cur.execute("SELECT pg_try_advisory_lock_shared(hashtext(%s), %s::int4)", (self._count_key, self.buckets))
            others = sorted({count for _, count in cur.execute(_MEMBERS, {"count_key": self._count_key}).fetchall()
                             if count != self.buckets})
            if others:
                self._drop()
                return (f"instances with another bucket count ({', '.join(map(str, others))}, not {self.buckets}) "
                        "are running: stop them first (COMMITLINE_PUBLISH_BUCKETS must be the same everywhere)")
            self.pid = self._conn.info.backend_pid
            self._owned.clear()
        log.info("%s: %s joined as pid %d", self.name, self.owner, self.pid)
        return None

    def state(self) -> GroupState:
        def read(conn: psycopg.Connection[Any]) -> GroupState:
            members = sorted(pid for pid, count in conn.cursor(row_factory=tuple_row).execute(
                _MEMBERS, {"count_key": self._count_key}).fetchall() if count == self.buckets)
            holders = lease_holders(conn, self.schema, self.names)
            owners = {b: holders[n].pid for b, n in enumerate(self.names) if n in holders}
            return GroupState(members, owners, self.pid)
        return self.run(read)

    def take(self, bucket: int) -> bool:
        """Own ``bucket`` if nobody does; its row is claimed (created from the group's position if new)."""
        def take(conn: psycopg.Connection[Any]) -> bool:
            got = conn.cursor(row_factory=tuple_row).execute(
                "SELECT pg_try_advisory_lock(hashtext('commitline'), hashtext(%s))",
                (f"{self.schema}/{self.names[bucket]}",)).fetchone()[0]
            if got:
                self.positions.claim(conn, self.names[bucket], self.owner, start_from=self.name)
                self._owned.add(bucket)
            return bool(got)
        return self.run(take)

    def give_up(self, bucket: int) -> None:
        def give_up(conn: psycopg.Connection[Any]) -> None:
            self._owned.discard(bucket)
            conn.execute("SELECT pg_advisory_unlock(hashtext('commitline'), hashtext(%s))",
                         (f"{self.schema}/{self.names[bucket]}",))
        try:
            self.run(give_up)
        except LeaseLost:
            pass  # the session is gone, and the lock with it

    def summarise(self, status: str) -> None:
        """Write the group's row from its buckets' rows (the owner of bucket 0 does, see the docstring)."""
        self.run(lambda conn: write_summary(conn, self.schema, self.name, self.buckets, self.owner, status))

    def saved_rows(self, conn: psycopg.Connection[Any]) -> dict[int, tuple[int, str]]:
        """Every bucket's saved (position, status) (a bucket without a row: the group's position, where it will
        start, and 'never run')."""
        rows = {name: (position, status) for name, position, status in conn.cursor(row_factory=tuple_row).execute(
            self._sql("SELECT name, position, status FROM {positions} WHERE name = ANY(%s) OR name = %s"),
            (self.names, self.name))}
        start = rows.get(self.name, (0, ""))[0]
        return {b: rows.get(n, (start, "never run")) for b, n in enumerate(self.names)}

    # -- the owned buckets' rows, many in one statement, on this member's connection --------

    def rows(self, buckets: Iterable[int]) -> dict[int, tuple[int, str]]:
        """(position, status) of owned buckets."""
        wanted = self._owned_names(buckets)
        found = self.run(lambda conn: {name: (int(position), str(status)) for name, position, status in conn.cursor(
            row_factory=tuple_row).execute(self._sql(
                "SELECT name, position, status FROM {positions} WHERE name = ANY(%s)"), (list(wanted),))})
        return {b: found.get(n, (0, "never run")) for n, b in wanted.items()}

    def save(self, rows: Sequence[tuple[int, int, dict[str, Any] | None]]) -> None:
        """Move owned buckets' positions, (bucket, position, poison) each: status 'running', or 'failed' with
        the poison record (the bucket then waits for an operator), as ``Positions.save`` does for one."""
        if not rows:
            return
        names = self._owned_names(b for b, _, _ in rows)
        inverse = {b: n for n, b in names.items()}
        self.run(lambda conn: conn.execute(self._sql(
            "UPDATE {positions} AS t SET position = u.position, status = CASE WHEN u.error IS NULL THEN 'running' "
            "ELSE 'failed' END, error = u.error::jsonb, updated_at = now() "
            "FROM unnest(%s::text[], %s::int8[], %s::text[]) AS u(name, position, error) WHERE t.name = u.name"),
            ([inverse[b] for b, _, _ in rows], [p for _, p, _ in rows],
             [None if e is None else json.dumps(e) for _, _, e in rows])))

    def mark(self, status: str, errors: dict[int, dict[str, Any]]) -> None:
        """Set ``status`` with each owned bucket's error (e.g. 'retrying' while the broker fails)."""
        if not errors:
            return
        names = self._owned_names(errors)
        inverse = {b: n for n, b in names.items()}
        self.run(lambda conn: conn.execute(self._sql(
            "UPDATE {positions} AS t SET status = %s, error = u.error::jsonb, updated_at = now() "
            "FROM unnest(%s::text[], %s::text[]) AS u(name, error) WHERE t.name = u.name"),
            (status, [inverse[b] for b in errors], [json.dumps(e) for e in errors.values()])))

    def hand_back(self, bucket: int, position: int | None = None, status: str = "stopped") -> None:
        """Let go of an owned bucket: save ``position`` if given (a move not saved yet), mark it ``status``
        (unless it is stopped at a poison record: that stays until an operator decides), unlock it."""
        def release(conn: psycopg.Connection[Any]) -> None:
            if position is not None:
                self.positions.save(conn, self.names[bucket], position)
            self.positions.released(conn, self.names[bucket], status)
        try:
            if self.owns(bucket):
                self.run(release)
        except (LeaseLost, psycopg.Error):
            pass  # a lost session let go of the lock already; the row keeps what was saved
        self.give_up(bucket)

    def _owned_names(self, buckets: Iterable[int]) -> dict[str, int]:
        names = {}
        for b in buckets:
            if not self.owns(b):
                raise LeaseLost(f"{self.names[b]}: bucket not owned")
            names[self.names[b]] = b
        return names

    def highest_position(self, conn: psycopg.Connection[Any]) -> int:
        """The highest position saved by the group or any bucket of it (of any bucket count)."""
        return int(conn.cursor(row_factory=tuple_row).execute(self._sql(
            "SELECT coalesce(max(position), 0) FROM {positions} WHERE name = %s OR starts_with(name, %s)"),
            (self.name, f"{self.name}/")).fetchone()[0])

    def reset_positions(self, conn: psycopg.Connection[Any]) -> None:
        """Everything is to be published again (an in-memory broker was replaced by an empty one)."""
        conn.execute(self._sql("UPDATE {positions} SET position = 0, updated_at = now() "
                               "WHERE name = %s OR starts_with(name, %s)"), (self.name, f"{self.name}/"))

    def _sql(self, text: str) -> Any:
        return SQL(text).format(positions=Identifier(self.schema, POSITIONS_TABLE))

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``work`` on the member connection; a connection failure means every bucket is lost."""
        with self._lock:
            if self._conn is None or not self.pid:
                raise LeaseLost(f"{self.name}: not a member (connection lost)")
            try:
                return work(self._conn)
            except psycopg.OperationalError as e:
                self._drop()
                raise LeaseLost(f"{self.name}: member connection lost: {type(e).__name__}") from None

    def leave(self) -> None:
        """Let go of everything (closing the session releases every lock it holds)."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        self.pid = 0
        self._owned.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass


def write_summary(conn: Any, schema: str, name: str, buckets: int, owner: str | None, status: str) -> None:
    """The group row of ``name`` from its ``buckets`` bucket rows: the lowest position (but never past the
    group's own while some bucket has no row: that bucket will start from it), ``failed`` or ``retrying``
    with the first such bucket's error (naming the bucket), else ``status``; ``owner`` None keeps it."""
    names = [bucket_name(name, b, buckets) for b in range(buckets)]
    conn.execute(SQL(
        "WITH b AS (SELECT name, position, status, error FROM {positions} WHERE name = ANY(%(names)s)), "
        "bad AS (SELECT status, coalesce(error, '{{}}'::jsonb) || jsonb_build_object('bucket', name) AS error FROM b "
        " WHERE status IN ('failed', 'retrying') ORDER BY status = 'failed' DESC, name LIMIT 1), "
        "own AS (SELECT position FROM {positions} WHERE name = %(name)s), "
        "s AS (SELECT CASE WHEN (SELECT count(*) FROM b) >= cardinality(%(names)s::text[]) "
        " THEN (SELECT min(position) FROM b) "
        " ELSE least((SELECT min(position) FROM b), coalesce((SELECT position FROM own), 0)) END AS position) "
        "INSERT INTO {positions} AS t (name, position, owner, status, error) "
        "SELECT %(name)s, coalesce(s.position, (SELECT position FROM own), 0), %(owner)s, "
        " coalesce((SELECT status FROM bad), %(status)s), (SELECT error FROM bad) FROM s "
        "ON CONFLICT (name) DO UPDATE SET position = excluded.position, owner = coalesce(excluded.owner, t.owner), "
        " status = excluded.status, error = excluded.error, updated_at = now()"
    ).format(positions=Identifier(schema, POSITIONS_TABLE)),
        {"names": names, "name": name, "owner": owner, "status": status})


def stopped_buckets(conn: Any, schema: str, name: str) -> list[tuple[str, dict[str, Any]]]:
    """(bucket name, error) of every bucket of group ``name`` (of any count) stopped at a poison event."""
    return [(n, e) for n, e in conn.cursor(row_factory=tuple_row).execute(SQL(
        "SELECT name, error FROM {} WHERE starts_with(name, %s) AND status = 'failed' AND error IS NOT NULL "
        "ORDER BY name").format(Identifier(schema, POSITIONS_TABLE)), (f"{name}/",)).fetchall()]
