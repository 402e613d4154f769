"""Exclusive ownership of a follower's work, and its saved position.

A follower (the Kafka publisher, a projection) works only while it holds its lease: a
PostgreSQL session-level advisory lock on a dedicated connection. If the owner dies or
its connection drops, PostgreSQL releases the lock and a waiting instance takes over.

Positions (``positions.py``) are written *on the lease connection*, so a write made after
the session was lost fails instead of moving the position: the lease fences its own
position. SKIP LOCKED is never used for ordered work (seed 004).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL

from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.store.datastore import connect_options, store_failures

log = logging.getLogger(__name__)
T = TypeVar("T")


class LeaseLost(RuntimeError):
    """The lease connection failed: another instance may own the work now. Stop and re-acquire."""


def instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Lease:
    def __init__(self, conninfo: dict[str, Any], schema: str, name: str, owner: str | None = None):
        self.conninfo = conninfo
        self.schema = schema
        self.name = name
        self.owner = owner or instance_id()
        self._conn: psycopg.Connection[Any] | None = None
        self.positions = Positions(schema)
        self._lock_key = f"{schema}/{name}"
        self._held = False

    @property
    def held(self) -> bool:
        return self._held

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; never waits. StoreUnavailable if PostgreSQL cannot be used."""
        with store_failures(self.conninfo, lambda _: self._drop()):
            self._connect()
            assert self._conn is not None
            got = self._conn.cursor(row_factory=tuple_row).execute(
                "SELECT pg_try_advisory_lock(hashtext('commitline'), hashtext(%s))", (self._lock_key,)
            ).fetchone()[0]
            if not got:
                return False
            self._claim()
            return True

    def _connect(self) -> None:
        if self._conn is None:
            self._conn = psycopg.connect(**connect_options(
                self.conninfo, connect_timeout=10,
                keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                # libpq's fallback: an application_name in the database URL takes precedence.
                fallback_application_name=f"commitline {self.name}"[:63],
            ), autocommit=True)

    def _claim(self) -> None:
        assert self._conn is not None
        self.positions.claim(self._conn, self.name, self.owner)
        self._held = True
        log.info("%s: lease taken by %s", self.name, self.owner)

    def acquire(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the lease; a live projector yields to such a waiter."""
        with store_failures(self.conninfo, lambda _: self._drop()):
            self._connect()
            assert self._conn is not None
            try:
                with self._conn.transaction():
                    self._conn.execute(SQL("SET LOCAL lock_timeout = {}").format(int(timeout * 1000)))
                    self._conn.execute("SELECT pg_advisory_lock(hashtext('commitline'), hashtext(%s))",
                                       (self._lock_key,))
            except psycopg.errors.LockNotAvailable:
                return False
            self._claim()
            return True

    def has_waiters(self) -> bool:
        """True when another session is blocked waiting for this lease (a rebuild about to swap)."""
        return self.run(lambda conn: conn.cursor(row_factory=tuple_row).execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks held JOIN pg_locks waiting USING "
            "(locktype, database, classid, objid, objsubid) WHERE held.locktype = 'advisory' "
            "AND held.pid = pg_backend_pid() AND held.granted AND NOT waiting.granted)").fetchone()[0])

    def position(self) -> int:
        return self.own_row()[0]

    def own_row(self) -> tuple[int, str]:
        """(position, status) of this lease's follower."""
        position, status, _ = self.run(lambda conn: self.positions.read(conn, self.name))
        return position, status

    def save_position(self, position: int, poison: dict[str, Any] | None = None) -> None:
        """Move the position; with ``poison`` the follower stops there for an operator."""
        self.run(lambda conn: self.positions.save(conn, self.name, position, poison=poison))

    def set_status(self, status: str, error: dict[str, Any] | None = None) -> None:
        self.run(lambda conn: self.positions.set_status(conn, self.name, status, error))

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``work`` on the lease connection; any connection failure means the lease is lost."""
        if self._conn is None or not self._held:
            raise LeaseLost(f"{self.name}: lease not held")
        try:
            return work(self._conn)
        except psycopg.OperationalError as e:
            self._drop()
            raise LeaseLost(f"{self.name}: lease connection lost: {type(e).__name__}") from None

    def release(self, status: str = "stopped") -> None:
        if self._conn is None:
            return
        try:
            self.run(lambda conn: self.positions.released(conn, self.name, status))
            self._conn.execute("SELECT pg_advisory_unlock(hashtext('commitline'), hashtext(%s))", (self._lock_key,))
        except (LeaseLost, psycopg.Error):
            pass
        self._drop()

    def _drop(self) -> None:
        self._held = False
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
