"""The API keys a serving process has resolved, kept so that a request does not read its key again.

Reading the key was a round trip to PostgreSQL on every HTTP request, about a quarter of the server's CPU per
command. The cache keeps only active keys (an unknown or revoked one is read every time, so a new key works
at once), each at most ``ttl_s`` seconds, under the SHA-256 of the key (never the key itself).

A revocation must still be refused from the next request on, in every process. Every change to the keys
table (a revocation, a deletion, an operator's ``UPDATE``; migration 15's trigger, whatever made it) notifies
the schema's channel (``api_keys.changes_channel``) when it commits. The cache holds a connection that
listens on that channel, and every lookup first reads what the connection received (a non-blocking read of
its socket, no round trip): any notification empties the cache. PostgreSQL signals the listening sessions as
the change commits, before it acknowledges the commit to the session that made it, and each passes the
notification on at once: by the time ``tenants revoke`` has returned, every listening connection holds it, or
receives it within a fraction of a millisecond.

Without a listening connection the cache is not used: the first lookup connects (outside the lock, one
thread at a time; every other request reads its key meanwhile), a lost connection empties the cache and is
replaced at most once per ``RETRY_S``, and whatever changed while it was down is covered by emptying the
cache when it listens again. A connection whose server vanished without closing it (a failover) would be
found dead only by its keepalives, tens of seconds later, so the feed also gives it up as soon as the pool
finds one of its own connections ended by the server (``lost``), and listens again on the next lookup. A lookup that read its key while the cache was emptied does not keep what it
read (``_generation``), so a read racing a revocation cannot outlive it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.store.datastore import LISTENING, connect_options

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_S = 1.0  # the shortest pause between two attempts to listen
_MORE_READS = 4  # reads of a socket that is still readable after the first (notifications may keep arriving)
APPLICATION_NAME = "commitline api keys (pid {pid})"  # which process listens, in pg_stat_activity

#: What ``ChangeFeed.poll`` found.
QUIET, CHANGED, DEAF = "quiet", "changed", "deaf"


class ChangeFeed:
    """A connection listening on ``channel``, read only when asked (``poll``): no thread, no waiting."""

    def __init__(self, conninfo: dict[str, Any], channel: str, lost: Callable[[], int] = lambda: 0):
        self.conninfo = conninfo
        self.channel = channel
        self._lost = lost  # how many pooled connections were found ended by the server, so far
        self._lost_seen = lost()
        self._conn: psycopg.Connection[Any] | None = None
        self._connecting = False
        self._retry_at = 0.0
        self._closed = False
        self.backend_pid: int | None = None  # the listening session's server process
        self.connections = 0  # how many times it began to listen
        self._failing = False  # attempts to listen fail (said once, and once more when one succeeds)

    def poll(self, lock: threading.Lock) -> str:
        """``CHANGED`` if a notification arrived since the last poll (or the feed began to listen: what changed
        before is unknown), ``QUIET`` if none did, ``DEAF`` while it does not listen. Called holding ``lock``,
        which it gives up while it connects."""
        lost = self._lost()
        if lost != self._lost_seen:  # the server the pool used went away: so may have this connection's
            self._lost_seen = lost
            if self._conn is not None:
                log.warning("API key change notifications (LISTEN %s): the pool lost connections to the server; "
                            "listening again", self.channel)
                self._drop()
                self._retry_at = 0.0
                return DEAF
        conn = self._conn
        if conn is None:
            return self._listen(lock)
        try:
            conn.pgconn.consume_input()  # what the socket holds, without blocking
            # A session the server ended leaves its last message, then the end of the stream: the first read takes
            # the message without an error, so read again while the socket still has something (the end raises).
            for _ in range(_MORE_READS):
                if not select.select([conn.pgconn.socket], [], [], 0)[0]:
                    break
                conn.pgconn.consume_input()
            changed = False
            while conn.pgconn.notifies() is not None:
                changed = True
        except (psycopg.Error, OSError) as e:  # the server ended the session, or the network did
            log.warning("API key change notifications (LISTEN %s) lost (%s): keys are read on every request "
                        "until they listen again", self.channel, type(e).__name__)
            self._drop()
            return DEAF
        return CHANGED if changed else QUIET

    def _listen(self, lock: threading.Lock) -> str:
        if self._closed or self._connecting or time.monotonic() < self._retry_at:
            return DEAF
        self._connecting = True
        lock.release()  # a connection may take up to connect_timeout: other requests read their keys meanwhile
        conn = None
        try:
            options = connect_options(self.conninfo, **LISTENING,
                                      application_name=APPLICATION_NAME.format(pid=os.getpid()))
            conn = psycopg.connect(**options, autocommit=True)
            conn.execute(SQL("LISTEN {}").format(Identifier(self.channel)))
        except psycopg.Error as e:
            if not self._failing:  # once per outage, not once per attempt
                log.warning("cannot listen for API key changes (LISTEN %s): %s; keys are read on every request "
                            "until it listens again", self.channel, type(e).__name__)
            self._failing = True
            if conn is not None:
                conn.close()
            conn = None
        finally:
            lock.acquire()
            self._connecting = False
        if conn is None or self._closed:
            if conn is not None:
                conn.close()
            self._retry_at = time.monotonic() + RETRY_S
            return DEAF
        self._conn, self.backend_pid = conn, conn.info.backend_pid
        self.connections += 1
        if self._failing:
            log.warning("API key change notifications (LISTEN %s): listening again", self.channel)
            self._failing = False
        return CHANGED

    def _drop(self) -> None:
        conn, self._conn, self.backend_pid = self._conn, None, None
        self._retry_at = time.monotonic() + RETRY_S
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._closed = True
        self._drop()


class ApiKeyCache(Generic[T]):
    """Active keys resolved recently, each kept ``ttl_s`` seconds at most, emptied by ``feed``'s notifications
    and whenever the feed stops listening."""

    def __init__(self, feed: ChangeFeed, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.feed = feed
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[bytes, tuple[T, float]] = {}  # key's SHA-256 -> (resolved key, read at)
        self._generation = 0  # how many times the entries were emptied
        self.reads = 0  # lookups that read the key (the cache could not answer)

    def resolve(self, key: str, read: Callable[[], T | None]) -> T | None:
        """The active key ``key`` is, from the cache or else from ``read`` (None: unknown or revoked)."""
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        now = self._clock()
        with self._lock:
            found = self.feed.poll(self._lock)
            if found != QUIET:
                self._entries.clear()
                self._generation += 1
            listening = found != DEAF
            if listening:
                entry = self._entries.get(digest)
                if entry is not None and now - entry[1] < self.ttl_s:
                    return entry[0]
            generation = self._generation
            self.reads += 1
        resolved = read()
        if resolved is not None and listening:
            with self._lock:
                if self._generation == generation:  # nothing changed (as far as notified) since before the read
                    self._entries[digest] = (resolved, now)
        return resolved

    def forget(self) -> None:
        """Empty the cache now: this process changed the keys itself, and its own notification may still be on
        its way."""
        with self._lock:
            self._entries.clear()
            self._generation += 1

    def close(self) -> None:
        self.forget()
        with self._lock:
            self.feed.close()
