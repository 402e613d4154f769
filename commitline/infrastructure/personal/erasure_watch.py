"""``ErasureWatch``: an erasure made by any process reaches this one within moments, not a key cache's lifetime.

The transaction that erases a subject notifies the erased key's id on the schema's erasure channel
(``keys.erasure_channel``), delivered when it commits. A process that holds data keys listens on one
connection of its own, in a daemon thread started when it first holds a key (a process that never opens a
personal value opens no connection), and calls ``forget`` with each notified key id: the event store drops
the key and every aggregate it holds decoded. The first data key is read only once the thread listens (or
failed to, or ``FIRST_WAIT_S`` passed), so no erasure after it is missed.

Notifications sent while the connection is down are lost. So when the thread loses its connection, and again
each time it listens anew (but the first time, if keys were read only after it), it calls ``forget_all``:
every data key held and every decoded aggregate is dropped and read again when next needed.
While it is disconnected, keys read meanwhile still expire ``PersonalData.ttl_s`` after they were read.

A connection whose server vanished without closing it (a failover) would be found dead only by its TCP
keepalives, tens of seconds later, deaf meanwhile to erasures made on the new primary. So the thread also gives
its connection up, and listens anew (dropping every key held), within ``WAIT_S`` of the pool finding one of its
own connections ended by the server (``lost``: ``StoreDatastore.connections_lost``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.store.datastore import LISTENING, connect_options

log = logging.getLogger(__name__)

WAIT_S = 0.5  # the longest the thread waits for a notification before looking at ``close``
FIRST_WAIT_S = 5.0  # the longest the first use of a data key waits for the listener to listen
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # pauses between attempts to listen again, the last one repeated
APPLICATION_NAME = "commitline erasures (pid {pid})"  # which process listens, in pg_stat_activity


class ErasureWatch:
    """Listens on ``channel`` over ``conninfo`` (libpq parameters) in a daemon thread once ``start``-ed."""

    def __init__(self, conninfo: dict[str, Any], channel: str, forget: Callable[[list[UUID]], None],
                 forget_all: Callable[[], None], lost: Callable[[], int] = lambda: 0):
        self.conninfo = conninfo
        self.channel = channel
        self._lost = lost  # how many pooled connections were found ended by the server, so far
        self._forget, self._forget_all = forget, forget_all
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._tried = threading.Event()  # set once the first attempt to listen succeeded or failed
        self.listening = threading.Event()  # set while LISTEN is in place
        self.backend_pid: int | None = None  # the listening connection's server process
        self.connections = 0  # how many times it began to listen
        self._was_down = False  # interrupted since it last listened (said once, and once more when it listens)

    def start(self) -> None:
        """Begin listening (once; nothing after ``close``); returns once it listens, or after its first attempt
        failed, or ``FIRST_WAIT_S``."""
        if self._tried.is_set() or self._stop.is_set():
            return
        with self._start_lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="commitline-erasures", daemon=True)
                self._thread.start()
        if not self._tried.wait(FIRST_WAIT_S):
            self._tried.set()  # keys are read before it listens: it drops them all once it does

    def close(self, wait_s: float = 0.0) -> None:
        """Stop listening: the thread closes its connection within ``WAIT_S`` (waited for up to ``wait_s``)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and wait_s > 0:
            thread.join(wait_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        failures = 0  # attempts in a row that never came to listen
        while not self._stop.is_set():
            listened = self.connections
            try:
                self._listen()
            except Exception as e:  # lost or refused
                if self._stop.is_set():
                    break
                if self.connections > listened:
                    failures = 0
                self._was_down = True
                if failures == 0:  # once per outage: the attempts after it fail alike, until one listens
                    log.warning("erasure notifications (LISTEN %s) interrupted (%s): every data key and decoded "
                                "aggregate held is dropped; listening again", self.channel, type(e).__name__)
                pause = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
            else:
                pause = 0.0
            finally:
                self.listening.clear()
                self.backend_pid = None
                self._tried.set()
            if not self._stop.is_set():
                self._dropped()  # notifications may have been missed
                self._stop.wait(pause)

    def _listen(self) -> None:
        """Listens until ``close``; returns early when the pool lost connections meanwhile, raises when this one
        is lost."""
        lost = self._lost()
        options = connect_options(self.conninfo, **LISTENING, application_name=APPLICATION_NAME.format(
            pid=os.getpid()))
        with psycopg.connect(**options, autocommit=True) as conn:
            conn.execute(SQL("LISTEN {}").format(Identifier(self.channel)))
            self.backend_pid = conn.info.backend_pid
            if self._tried.is_set():  # keys may have been read before LISTEN took effect
                self._dropped()
            if self._was_down:
                log.warning("erasure notifications (LISTEN %s): listening again", self.channel)
                self._was_down = False
            self.connections += 1
            self.listening.set()
            self._tried.set()
            while not self._stop.is_set():
                for notification in conn.notifies(timeout=WAIT_S):
                    try:
                        erased = UUID(notification.payload)
                    except ValueError:  # not sent by commitline: which key it means is unknown
                        self._dropped()
                    else:
                        self._forget([erased])
                if self._lost() != lost:  # the server the pool used went away: so may have this connection's
                    log.warning("erasure notifications (LISTEN %s): the pool lost connections to the server; every "
                                "data key and decoded aggregate held is dropped; listening again", self.channel)
                    return

    def _dropped(self) -> None:
        try:
            self._forget_all()
        except Exception:
            log.exception("dropping the data keys and decoded aggregates held failed")
