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
  ``pg_locks`` alone (``plan_rebalance``). The follower engine (``engine.py``) takes and hands back the
  buckets between two rounds, as the publisher's rebalance hook (``kafka/publisher.py``) asks.
- **Summary row.** The group's own row (e.g. ``kafka-publisher``) is kept by the owner of bucket 0:
  its position is the lowest bucket position (every event at or below it has been handled by its
  bucket), its status ``failed``/``retrying`` with that bucket's error while any bucket is. A bucket
  that has no row yet starts from it (``Positions.claim``), as it did from the single publisher's.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL

from commitline.infrastructure.followers.buckets import bucket_name
from commitline.infrastructure.followers.fenced import FencedConnection, LeaseLost
from commitline.infrastructure.followers.status import lease_holders
from commitline.infrastructure.store.datastore import store_failures

log = logging.getLogger(__name__)
UNOWNED_GRACE_SECONDS = 3.0

#: Each live member of a group with its bucket count (the second key of its shared count lock).
MEMBER_COUNTS = SQL(
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


@dataclass(frozen=True)
class Rebalance:
    """What a member does this round: hand over ``hand_over``, or try ``candidates`` until it took ``wanted``."""

    hand_over: list[int]
    candidates: list[int]
    wanted: int
    share: int


def plan_rebalance(state: GroupState, buckets: int, mine: Iterable[int], unowned_since: dict[int, float],
                   now: float) -> Rebalance:
    """Above its share while another member is below its own: hand over the surplus (the lowest buckets stay,
    so the owner of bucket 0 keeps the group's row). Below its share: take unowned buckets, in random order. At
    its share: only a bucket left unowned for ``UNOWNED_GRACE_SECONDS``, one per round, so none stays unowned
    long when members disagree for a moment. ``unowned_since`` is kept up to date here."""
    share = state.share(buckets)
    mine = sorted(mine)
    unowned = [b for b in range(buckets) if b not in state.owners]
    since = {b: unowned_since.get(b, now) for b in unowned}
    unowned_since.clear()
    unowned_since.update(since)
    someone_short = any(len(state.owned_by(m)) < state.share(buckets, m) for m in state.members)
    if len(mine) > share and someone_short:
        return Rebalance(mine[share:], [], 0, share)
    if share > len(mine):
        return Rebalance([], random.sample(unowned, len(unowned)), share - len(mine), share)
    late = [b for b in unowned if now - since[b] >= UNOWNED_GRACE_SECONDS][:1]
    return Rebalance([], late, len(late), share)


class GroupLease(FencedConnection):
    """One instance's membership of the group ``name`` and the buckets it owns, on its fenced connection: to
    the follower engine, an ownership whose slots are the buckets."""

    lost = "member connection lost"
    join_poll_seconds = 2.0

    def __init__(self, conninfo: dict[str, Any], schema: str, name: str, buckets: int, owner: str):
        super().__init__(conninfo, schema, name, owner)
        self.buckets = buckets
        self.names = [bucket_name(name, b, buckets) for b in range(buckets)]
        self._member_key = self.lock_key(name)
        self._count_key = f"{schema}/{name}@buckets"
        self._owned: set[int] = set()
        self.pid = 0

    def _held(self) -> bool:
        return self.pid != 0

    def _not_held(self) -> str:
        return f"{self.name}: not a member (connection lost)"

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
            conn = self._connect(f"commitline {self.name} {self.owner}")
            if not self.try_lock(conn, self._member_key, shared=True):
                self._drop()
                return f"another instance holds {self.name} alone (a commitline publishing without buckets)"
            cur = conn.cursor(row_factory=tuple_row)
            cur.execute("SELECT pg_try_advisory_lock_shared(hashtext(%s), %s::int4)", (self._count_key, self.buckets))
            others = sorted({count for _, count in cur.execute(MEMBER_COUNTS, {"count_key": self._count_key}).fetchall()
                             if count != self.buckets})
            if others:
                self._drop()
                return (f"instances with another bucket count ({', '.join(map(str, others))}, not {self.buckets}) "
                        "are running: stop them first (COMMITLINE_PUBLISH_BUCKETS must be the same everywhere)")
            self.pid = conn.info.backend_pid
            self._owned.clear()
            self._read_generation(conn)
        log.info("%s: %s joined as pid %d", self.name, self.owner, self.pid)
        return None

    def initial_slots(self) -> list[int]:
        return []  # buckets are taken by rebalancing

    def state(self) -> GroupState:
        def read(conn: psycopg.Connection[Any]) -> GroupState:
            members = sorted(pid for pid, count in conn.cursor(row_factory=tuple_row).execute(
                MEMBER_COUNTS, {"count_key": self._count_key}).fetchall() if count == self.buckets)
            holders = lease_holders(conn, self.schema, self.names)
            owners = {b: holders[n].pid for b, n in enumerate(self.names) if n in holders}
            return GroupState(members, owners, self.pid)
        return self.run(read)

    def take(self, bucket: int) -> bool:
        """Own ``bucket`` if nobody does; its row is claimed (created from the group's position if new)."""
        def take(conn: psycopg.Connection[Any]) -> bool:
            got = self.try_lock(conn, self.lock_key(self.names[bucket]))
            if got:
                self.positions.claim(conn, self.names[bucket], self.owner, start_from=self.name,
                                     generation=self.generation)
                self._owned.add(bucket)
            return got
        return self.run(take)

    def give_up(self, bucket: int) -> None:
        def give_up(conn: psycopg.Connection[Any]) -> None:
            self._owned.discard(bucket)
            self.unlock(conn, self.lock_key(self.names[bucket]))
        try:
            self.run(give_up)
        except LeaseLost:
            pass  # the session is gone, and the lock with it

    def tick(self, owned: Iterable[int]) -> dict[int, tuple[int, str]]:
        """Keep the group's row (the owner of bucket 0 does), and read the rows of the buckets others own."""
        owned = set(owned)
        if 0 in owned:
            self.summarise("running")
        if len(owned) == self.buckets:
            return {}
        return {b: row for b, row in self.run(self.saved_rows).items() if b not in owned}

    def handed_back(self, buckets: Sequence[int], summary: str) -> None:
        """The owner of bucket 0 keeps the group's row, so it writes it as it lets go (status ``summary``)."""
        if 0 in buckets:
            self.summarise(summary)

    def summarise(self, status: str) -> None:
        """Write the group's row from its buckets' rows (the owner of bucket 0 does, see the docstring)."""
        self.run(lambda conn: self.positions.write_summary(conn, self.name, self.names, self.owner, status))

    def saved_rows(self, conn: psycopg.Connection[Any]) -> dict[int, tuple[int, str]]:
        """Every bucket's saved (position, status) (a bucket without a row: the group's position, where it will
        start, and 'never run')."""
        rows = self.positions.read_many(conn, [*self.names, self.name])
        start = rows.get(self.name, (0, ""))[0]
        return {b: rows.get(n, (start, "never run")) for b, n in enumerate(self.names)}

    # -- the owned buckets' rows, many in one statement, on this member's connection --------

    def rows(self, buckets: Iterable[int]) -> dict[int, tuple[int, str]]:
        """(position, status) of owned buckets, each stopped if the store went back behind it (``went_back.py``)."""
        wanted = self._owned_names(buckets)
        found = self.run(lambda conn: self.checked_rows(conn, list(wanted)))
        return {b: found[n] for n, b in wanted.items()}

    def save(self, rows: Sequence[tuple[int, int, dict[str, Any] | None]]) -> None:
        """Move owned buckets' positions, (bucket, position, poison) each: status 'running', or 'failed' with
        the poison record (the bucket then waits for an operator), as ``Positions.save`` does for one."""
        if not rows:
            return
        names = {b: n for n, b in self._owned_names(b for b, _, _ in rows).items()}
        self.run(lambda conn: self.positions.save_many(conn, [(names[b], p, e) for b, p, e in rows], self.generation))

    def mark(self, status: str, errors: dict[int, dict[str, Any]]) -> None:
        """Set ``status`` with each owned bucket's error (e.g. 'retrying' while the broker fails)."""
        if not errors:
            return
        names = {b: n for n, b in self._owned_names(errors).items()}
        self.run(lambda conn: self.positions.mark_many(conn, status, {names[b]: e for b, e in errors.items()}))

    def hand_back(self, bucket: int, position: int | None = None, status: str = "stopped") -> None:
        """Let go of an owned bucket: save ``position`` if given (a move not saved yet), mark it ``status``
        (unless it is stopped at a poison record: that stays until an operator decides), unlock it."""
        def release(conn: psycopg.Connection[Any]) -> None:
            if position is not None:
                self.positions.save(conn, self.names[bucket], position, generation=self.generation)
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

    def highest_position(self) -> int:
        """The highest position saved by the group or any bucket of it (of any bucket count)."""
        return self.run(lambda conn: self.positions.highest_of_group(conn, self.name))

    def reset_positions(self) -> None:
        """Everything is to be published again (an in-memory broker was replaced by an empty one)."""
        self.run(lambda conn: self.positions.reset_group(conn, self.name))

    def has_waiters(self) -> bool:
        return False  # nothing waits for a publish group's buckets

    def leave(self, status: str = "stopped") -> None:
        """Let go of everything (closing the session releases every lock it holds)."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        self.pid = 0
        self._owned.clear()
        super()._drop()

