"""The PostgreSQL datastore: eventsourcing's pool, with every failure to reach or use PostgreSQL
surfacing as ``StoreUnavailable``.

Underneath, an outage takes many shapes: a refused connection (psycopg ``OperationalError``), a
session ended by a shutdown or a crash (``AdminShutdown``, "server closed the connection
unexpectedly"), a connection already closed (``InterfaceError``), no pooled connection within
``COMMITLINE_POOL_TIMEOUT_S`` (``PoolTimeout``), and eventsourcing's wrappers of all of these.
Callers see one error, whose message names the server but never the password. It means "retry
with the same key": if the connection died while a COMMIT was in flight, the command may or may
not be stored, and its idempotency record (committed with its events or not at all) makes the
retry return the stored outcome or apply the command once.

Recovery once the server is back is prompt:

- a pooled connection the server has ended (its goodbye is waiting on the socket) is replaced
  before it is used, so the first calls after a restart do not fail on connections it broke;
- a call that finds its connection broken has the pool check its idle connections too;
- the pool gives up replacing a lost connection after the pool timeout and opens one on demand
  for the next caller, instead of backing off for up to five minutes (psycopg_pool's default).

The group commit's batches follow each other closely, and psycopg_pool's check-out and return cost more
interpreter time than a small batch's own statements: ``kept_connection`` keeps a few connections checked
out between batches (each gone back through the pool, with its lifetime and health rules, at least every
``KEEP_FOR_S``). A kept connection is checked like a pooled one before use, and one found ended by the
server sends every kept one back to the pool.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from eventsourcing import persistence
from eventsourcing.postgres import PostgresDatastore
from psycopg_pool import ConnectionPool, PoolClosed

from commitline.application.errors import Closed, StoreUnavailable

# psycopg_pool's PoolTimeout is a psycopg.OperationalError; eventsourcing's get_connection()
# re-raises psycopg's errors as its own.
STORE_FAILURES: tuple[type[Exception], ...] = (
    psycopg.OperationalError, psycopg.InterfaceError, persistence.OperationalError, persistence.InterfaceError,
)


SECRET_PARTS = ("password", "sslpassword")

#: A connection of its own that listens for notifications: TCP keepalives find one whose peer vanished without
#: closing it (a notification sent meanwhile is lost, and the listener must know it).
LISTENING = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
             "keepalives_count": 3}


def connect_options(parts: Mapping[str, Any], **defaults: Any) -> dict[str, Any]:
    """Keyword arguments for ``psycopg.connect``: commitline's ``defaults`` for this kind of connection
    (``connect_timeout``, ``application_name``, keepalives, ...) overridden by every libpq parameter of the
    database URL, so what an operator configured (sslmode, sslrootcert, options, ...) always applies."""
    return {**defaults, **parts}


def describe_failure(error: BaseException, parts: Mapping[str, Any]) -> str:
    """What failed, where, as whom, and with which sslmode if one is set: never a password."""
    text = f"{type(error).__name__}: {error}"
    for secret in SECRET_PARTS:
        if parts.get(secret):
            text = text.replace(str(parts[secret]), "***")
    tls = f" (sslmode={parts['sslmode']})" if parts.get("sslmode") else ""
    return f"cannot use PostgreSQL at {_servers(parts)}/{parts['dbname']} as {parts['user']}{tls}: {text}"


def _servers(parts: Mapping[str, Any]) -> str:
    """``host:port``, or each ``host:port`` of a multi-host URL (libpq gives ``a,b`` and ``5432,5433``; one port
    for every host when only one is given)."""
    hosts, ports = str(parts.get("host")).split(","), str(parts.get("port")).split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    if len(ports) != len(hosts):
        return f"{parts.get('host')}:{parts.get('port')}"
    return ",".join(f"{h}:{p}" for h, p in zip(hosts, ports))


@contextmanager
def store_failures(parts: Mapping[str, Any],
                   on_failure: Callable[[BaseException], None] | None = None) -> Iterator[None]:
    """Raise ``StoreUnavailable`` for any failure to reach or use PostgreSQL in the block (after
    ``on_failure``). A closed pool is no outage but a use after ``close()``: ``Closed``."""
    try:
        yield
    except STORE_FAILURES as e:
        failure = e.__cause__ if isinstance(e, persistence.PersistenceError) and e.__cause__ is not None else e
        if isinstance(failure, PoolClosed):
            raise Closed() from None
        if on_failure is not None:
            on_failure(failure)
        raise StoreUnavailable(describe_failure(failure, parts)) from None


class StoreDatastore(PostgresDatastore):
    """A ``PostgresDatastore`` whose connections raise ``StoreUnavailable`` for every store failure."""

    #: At most this many connections kept out of the pool between group-commit batches (one per flush slot).
    KEEP = 2
    #: A kept connection goes back through the pool at least this often (seconds).
    KEEP_FOR_S = 30.0

    def __init__(self, dbname: str, host: str, port: int | str, user: str, password: str, *, pool_timeout: float,
                 libpq: Mapping[str, Any] | None = None, **options: Any):
        # eventsourcing hands ``connect_timeout`` to the pool as the longest wait for a connection.
        super().__init__(dbname, host, port, user, password, connect_timeout=pool_timeout, **options)
        # Its pool connects with the five parameters above only; every other libpq parameter of the URL
        # (``libpq``: sslmode, application_name, options, ...) joins the pool's connection kwargs before it opens.
        self.pool.kwargs.update(libpq or {})
        self.pool.reconnect_timeout = pool_timeout
        # Never all of the pool: other callers (reads, snapshots) always find room beside the kept ones.
        self._keep = max(0, min(self.KEEP, self.pool.max_size - 2))
        self._kept: list[tuple[psycopg.Connection[Any], float]] = []  # (connection, taken from the pool at)
        self._kept_lock = threading.Lock()
        self._closing = False
        # How many pooled connections were found ended by the server: each is replaced by one that may reach
        # another server (a promoted standby), which followers prove their fenced session against.
        self.connections_lost = 0

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A pooled connection as it is (no type adapters: the recorder's fast path)."""
        return self._guarded(self.pool.connection)

    def probe_connection(self, timeout: float) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A pooled connection within ``timeout`` seconds, or ``StoreUnavailable``: for a readiness probe, which
        must answer promptly while the server is down rather than wait the pool timeout."""
        return self._guarded(lambda: self.pool.connection(timeout=timeout))

    def get_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:  # type: ignore[override]
        return self._guarded(super().get_connection)

    def kept_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """Like ``connection``, but afterwards the connection stays checked out for the next caller (up to
        ``KEEP`` of them) instead of going back to the pool: for the group commit's batches."""
        return self._guarded(self._kept_or_pooled)

    @contextmanager
    def _kept_or_pooled(self) -> Iterator[psycopg.Connection[Any]]:
        kept = self._take_kept()
        conn, since = kept if kept is not None else (self.pool.getconn(), time.monotonic())
        done = False
        try:
            yield conn
            done = True
        finally:
            if not (done and self._keep_it(conn, since)):
                self.pool.putconn(conn)  # the pool resets, replaces or closes it as it would any other

    def _take_kept(self) -> tuple[psycopg.Connection[Any], float] | None:
        while True:
            with self._kept_lock:
                if not self._kept:
                    return None
                conn, since = self._kept.pop()
            if time.monotonic() - since < self.KEEP_FOR_S:
                return conn, since
            self.pool.putconn(conn)

    def _keep_it(self, conn: psycopg.Connection[Any], since: float) -> bool:
        if conn.closed or conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False
        with self._kept_lock:
            if self._closing or len(self._kept) >= self._keep:
                return False
            self._kept.append((conn, since))
            return True

    def _return_kept(self) -> None:
        with self._kept_lock:
            kept, self._kept = self._kept, []
        for conn, _ in kept:
            self.pool.putconn(conn)

    def close(self) -> None:
        with self._kept_lock:
            self._closing = True
        self._return_kept()
        super().close()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @contextmanager
    def _guarded(self, connect: Callable[[], AbstractContextManager[Any]]) -> Iterator[Any]:
        conn = None

        def check_idle_if_broken(_: BaseException) -> None:
            if conn is not None and conn.closed:
                self.connections_lost += 1
                self.pool.check()

        with store_failures(self.pool.kwargs, check_idle_if_broken):
            for last_try in (False, True):
                with connect() as conn:
                    if last_try or not self._ended_by_server(conn):
                        yield conn
                        return

    def _ended_by_server(self, conn: psycopg.Connection[Any]) -> bool:
        """An idle pooled connection has nothing to read, so pending input is the server's goodbye (a
        shutdown, a crash) or, rarely, a notice: one round trip tells which. Costs a poll(2) per call;
        a connection the server ended is replaced instead of failing the call after a restart."""
        try:
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            if not poller.poll(0):
                return False
            ConnectionPool.check_connection(conn)
            return False
        except psycopg.Error:
            self.connections_lost += 1
            conn.close()  # failed its check: neither the pool nor the kept ones may hand it out again
            self._return_kept()  # its kept and idle neighbours are most likely gone too
            self.pool.check()
            return True
