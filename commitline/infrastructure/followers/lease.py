"""Exclusive ownership of a single follower's work, and its saved position: one slot for the engine.

A follower (a projection, a process manager's runner, a rebuild) works only while it holds its lease: a
PostgreSQL session-level advisory lock on its fenced connection (``fenced.py``). If the owner dies or its
connection drops, PostgreSQL releases the lock and a waiting instance takes over.

Positions (``positions.py``) are written *on the lease connection*, so a write made after the session was
lost fails instead of moving the position: the lease fences its own position. SKIP LOCKED is never used for
ordered work (seed 004). To the follower engine (``engine.py``) a lease is an ownership of one slot (0), as a
publish instance's group membership (``group.py``) is an ownership of its buckets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL

from commitline.infrastructure.followers.fenced import FencedConnection, LeaseLost, instance_id
from commitline.infrastructure.store.datastore import store_failures

__all__ = ["Lease", "LeaseLost", "instance_id"]
log = logging.getLogger(__name__)


class Lease(FencedConnection):
    lost = "lease connection lost"
    join_poll_seconds = 0.5  # a standby polls for the lease, so it never blocks the owner

    def __init__(self, conninfo: dict[str, Any], schema: str, name: str, owner: str | None = None):
        super().__init__(conninfo, schema, name, owner)
        self.names = [name]
        self._lock_key = self.lock_key(name)
        self._is_held = False

    @property
    def held(self) -> bool:
        return self._is_held

    def _held(self) -> bool:
        return self._is_held

    def _not_held(self) -> str:
        return f"{self.name}: lease not held"

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; never waits. StoreUnavailable if PostgreSQL cannot be used."""
        with self._lock, store_failures(self.conninfo, lambda _: self._drop()):
            conn = self._connect(f"commitline {self.name}")
            if not self.try_lock(conn, self._lock_key):
                return False
            self._claim()
            return True

    def _claim(self) -> None:
        assert self._conn is not None
        self.positions.claim(self._conn, self.name, self.owner, generation=self._read_generation(self._conn))
        self._is_held = True
        log.info("%s: lease taken by %s", self.name, self.owner)

    def acquire(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the lease; a live projector yields to such a waiter."""
        with self._lock, store_failures(self.conninfo, lambda _: self._drop()):
            conn = self._connect(f"commitline {self.name}")
            try:
                with conn.transaction():
                    conn.execute(SQL("SET LOCAL lock_timeout = {}").format(int(timeout * 1000)))
                    conn.execute("SELECT pg_advisory_lock(hashtext('commitline'), hashtext(%s))", (self._lock_key,))
            except psycopg.errors.LockNotAvailable:
                return False
            self._claim()
            return True

    def has_waiters(self) -> bool:
        """True when another session is blocked waiting for this lease (a rebuild about to swap)."""
        return bool(self.run(lambda conn: conn.cursor(row_factory=tuple_row).execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks held JOIN pg_locks waiting USING "
            "(locktype, database, classid, objid, objsubid) WHERE held.locktype = 'advisory' "
            "AND held.pid = pg_backend_pid() AND held.granted AND NOT waiting.granted)").fetchone()[0]))

    def position(self) -> int:
        return self.own_row()[0]

    def own_row(self) -> tuple[int, str]:
        """(position, status) of this lease's follower."""
        position, status, _ = self.run(lambda conn: self.positions.read(conn, self.name))
        return position, status

    def save_position(self, position: int, poison: dict[str, Any] | None = None) -> None:
        """Move the position; with ``poison`` the follower stops there for an operator."""
        self.run(lambda conn: self.positions.save(conn, self.name, position, poison=poison,
                                                  generation=self.generation))

    def set_status(self, status: str, error: dict[str, Any] | None = None) -> None:
        self.run(lambda conn: self.positions.set_status(conn, self.name, status, error))

    def release(self, status: str = "stopped") -> None:
        self.hand_back(0, None, status)
        self.leave(status)

    # -- the engine's ownership: one slot, 0 ------------------------------------------

    def join(self) -> str | None:
        """None once the lease is held; '' while another instance holds it (nothing worth logging)."""
        return None if self.try_acquire() else ""

    def initial_slots(self) -> list[int]:
        return [0]

    def rows(self, slots: Iterable[int]) -> dict[int, tuple[int, str]]:
        """The own row (position, status), stopped if the store went back behind it (``went_back.py``)."""
        if 0 not in set(slots):
            return {}
        return {0: self.run(lambda conn: self.checked_rows(conn, [self.name]))[self.name]}

    def save(self, rows: Sequence[tuple[int, int, dict[str, Any] | None]]) -> None:
        for _, position, poison in rows:
            self.save_position(position, poison)

    def mark(self, status: str, errors: dict[int, dict[str, Any]]) -> None:
        if 0 in errors:
            self.set_status(status, errors[0])

    def hand_back(self, slot: int, position: int | None = None, status: str = "stopped") -> None:
        """Save ``position`` if given, and mark the row ``status`` (a poison stop stays on record)."""
        def release(conn: psycopg.Connection[Any]) -> None:
            if position is not None:
                self.positions.save(conn, self.name, position, generation=self.generation)
            self.positions.released(conn, self.name, status)
        try:
            self.run(release)
        except (LeaseLost, psycopg.Error):
            pass

    def handed_back(self, slots: Sequence[int], summary: str) -> None:
        """Nothing besides its own row to write when it lets go."""

    def tick(self, owned: Iterable[int]) -> dict[int, tuple[int, str]]:
        """Nothing to keep besides the own row; no other slots."""
        return {}

    def leave(self, status: str = "stopped") -> None:
        with self._lock:
            if self._conn is not None and self._is_held:
                try:
                    self.unlock(self._conn, self._lock_key)
                except psycopg.Error:
                    pass
            self._drop()

    def _drop(self) -> None:
        self._is_held = False
        super()._drop()
