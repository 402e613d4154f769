"""A fenced connection: the one PostgreSQL session on which a follower instance holds its advisory locks and
writes its positions.

Both kinds of ownership stand on it: a single follower's lease (``lease.py``) and a publish instance's
membership of its group with the buckets it owns (``group.py``). The locks belong to the session, so if the
instance dies or its connection drops, PostgreSQL releases them and another instance takes over. Every
write goes through ``run``, on this same session: a write made after the session was lost fails (as
``LeaseLost``) instead of moving a position the instance no longer owns. The connection has TCP keepalives,
so a session whose peer vanished is noticed within seconds. Calls are serialised (one connection, many
threads: the follower's rounds and its supervision).

The session also knows the store generation it joined under (``store/generations.py``): every position it
saves records it, the rows it takes are checked against it (``went_back.py``), and ``check_generation``
(at every supervision tick) raises ``GenerationChanged`` once the operator started another: the follower
then lets go and joins again, under the new one.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row

from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.followers.went_back import check_rows
from commitline.infrastructure.store.datastore import connect_options
from commitline.infrastructure.store.generations import current_and_head

log = logging.getLogger(__name__)
T = TypeVar("T")


class LeaseLost(RuntimeError):
    """The lease connection failed: another instance may own the work now. Stop and re-acquire.
    ``session_failed``: the session itself broke (PostgreSQL may be away), not just the ownership."""

    def __init__(self, message: str, *, session_failed: bool = False):
        super().__init__(message)
        self.session_failed = session_failed


class GenerationChanged(LeaseLost):
    """The store started another generation since this session joined: join again, under the new one."""


def instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class FencedConnection:
    """The session of one instance of the follower ``name``; subclasses say when it counts as held."""

    lost = "connection lost"  # how a lost session is described in ``LeaseLost``

    def __init__(self, conninfo: dict[str, Any], schema: str, name: str, owner: str | None = None):
        self.conninfo = conninfo
        self.schema = schema
        self.name = name
        self.owner = owner or instance_id()
        self.positions = Positions(schema)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.RLock()
        self.generation = 0  # the store generation this session joined under (read as it joins)

    def _read_generation(self, conn: psycopg.Connection[Any]) -> int:
        """Read the store's generation as the session joins; what it saves from now on is recorded under it."""
        self.generation = current_and_head(conn, self.schema)[0]
        return self.generation

    def check_generation(self) -> None:
        """GenerationChanged when the store's generation is not the one this session joined under."""
        now, _ = self.run(lambda conn: current_and_head(conn, self.schema))
        if now != self.generation:
            raise GenerationChanged(f"{self.name}: the store's generation changed from {self.generation} to {now}")

    def checked_rows(self, conn: psycopg.Connection[Any], names: list[str]) -> dict[str, tuple[int, str]]:
        """(position, status) of the rows ``names``, each stopped if the store went back behind it."""
        generation, head = current_and_head(conn, self.schema)
        if generation != self.generation:
            raise GenerationChanged(f"{self.name}: the store's generation changed from {self.generation} to "
                                    f"{generation}")
        return check_rows(conn, self.positions, names, generation, head)

    def _held(self) -> bool:
        raise NotImplementedError

    def _not_held(self) -> str:
        return f"{self.name}: not held"

    def _connect(self, application_name: str) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = psycopg.connect(**connect_options(
                self.conninfo, connect_timeout=10,
                keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                # libpq's fallback: an application_name in the database URL takes precedence.
                fallback_application_name=application_name[:63],
            ), autocommit=True)
        return self._conn

    def lock_key(self, name: str) -> str:
        """The advisory lock key of follower ``name`` (``status.lease_holders`` finds its holder by it)."""
        return f"{self.schema}/{name}"

    @staticmethod
    def try_lock(conn: psycopg.Connection[Any], key: str, *, shared: bool = False) -> bool:
        function = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
        return bool(conn.cursor(row_factory=tuple_row).execute(
            f"SELECT {function}(hashtext('commitline'), hashtext(%s))", (key,)).fetchone()[0])

    @staticmethod
    def unlock(conn: psycopg.Connection[Any], key: str) -> None:
        conn.execute("SELECT pg_advisory_unlock(hashtext('commitline'), hashtext(%s))", (key,))

    def run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``work`` on the fenced session; any connection failure means everything held is lost."""
        with self._lock:
            if self._conn is None or not self._held():
                raise LeaseLost(self._not_held(), session_failed=self._conn is None)
            try:
                return work(self._conn)
            except psycopg.OperationalError as e:
                self._drop()
                raise LeaseLost(f"{self.name}: {self.lost}: {type(e).__name__}", session_failed=True) from None

    def _drop(self) -> None:
        """Close the session (which releases every lock it holds)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
