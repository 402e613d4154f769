"""Snapshots written behind the commands: a command whose events cross a multiple of the snapshot interval hands
its aggregate's encoded state to ``SnapshotWriter.offer`` and returns; one thread of the process inserts what was
offered, many snapshots per statement and per transaction.

A snapshot is derived data (its events are committed before it is offered), so it is written at best effort: a
command never waits for one, nor fails because one was not written. One lost (the process killed, the queue full,
the store refusing the insert) only makes a later load of its stream replay more events. ``flush`` waits until
what was offered is written or given up, ``close`` flushes and stops the thread.

The thread starts with the first offer, and again in a forked child (a thread does not survive ``fork``).
``flush_all`` waits for every writer of the process: what a test does before it counts a store's rows.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence

from commitline.application.errors import StoreUnavailable
from commitline.infrastructure.store.streams import Snapshot

log = logging.getLogger(__name__)

#: At most this many snapshots wait to be written; an offer beyond it is dropped (and counted).
QUEUE_LIMIT = 10_000
#: At most this many snapshots per insert.
BATCH = 500
#: How long the thread lets snapshots gather before it writes them (unless a batch is full, or a flush waits):
#: an insert of one costs about as much client CPU as an insert of ten.
LINGER_S = 0.05

_writers: weakref.WeakSet[SnapshotWriter] = weakref.WeakSet()


def flush_all(timeout: float | None = None) -> bool:
    """``flush`` every writer of this process; False if one was not flushed within ``timeout`` (each)."""
    return all([writer.flush(timeout) for writer in list(_writers)])


class SnapshotWriter:
    def __init__(self, save: Callable[[Sequence[Snapshot]], None], *, limit: int = QUEUE_LIMIT,
                 batch: int = BATCH, linger_s: float = LINGER_S) -> None:
        """``save``: inserts a batch of snapshots (``EventRecorder.save_snapshots``)."""
        self._save = save
        self._limit = limit
        self._batch = batch
        self._linger_s = linger_s
        self._waiting = 0  # flushes waiting: the thread writes at once
        self._queue: deque[Snapshot] = deque()
        self._cond = threading.Condition()
        self._writing = 0  # snapshots taken from the queue and not yet written or given up
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False
        #: counts since start: snapshots written, dropped because the queue was full, lost to a failed insert
        self.written = self.dropped = self.failed = 0
        _writers.add(self)

    def offer(self, snapshot: Snapshot) -> None:
        """Queue ``snapshot`` to be written; never blocks on the store."""
        with self._cond:
            if self._closed:
                return
            if len(self._queue) >= self._limit:
                self.dropped += 1
                return
            self._queue.append(snapshot)
            if self._pid != os.getpid():
                self._start()
            if len(self._queue) in (1, self._batch):  # else the thread is awake, or lingering to gather more
                self._cond.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every snapshot offered so far is written or given up; False if ``timeout`` passed first."""
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: not self._queue and not self._writing, timeout)
            finally:
                self._waiting -= 1

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (waiting at most ``timeout``), then stop the thread; later offers are ignored."""
        with self._cond:
            if self._closed:
                return
            thread = self._thread if self._pid == os.getpid() else None
            if thread is not None:
                self._waiting += 1
                self._cond.notify_all()
                self._cond.wait_for(lambda: not self._queue and not self._writing, timeout)
                self._waiting -= 1
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)

    def _start(self) -> None:
        self._writing = 0  # in a forked child, the parent's batch in flight is not this process's
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="commitline-snapshots", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                self._cond.wait_for(lambda: len(self._queue) >= self._batch or self._waiting or self._closed,
                                    self._linger_s)
                if self._closed:
                    return
                batch = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
                self._writing = len(batch)
            try:
                self._save(batch)
                written, failed = len(batch), 0
            except StoreUnavailable as e:  # an outage: the reason is enough, the commands say the rest
                written, failed = 0, len(batch)
                log.warning("%d snapshot(s) not saved (loads of their streams replay from the previous one): %s",
                            len(batch), e)
            except Exception:
                written, failed = 0, len(batch)
                log.warning("%d snapshot(s) not saved (loads of their streams replay from the previous one)",
                            len(batch), exc_info=True)
            with self._cond:
                self.written += written
                self.failed += failed
                self._writing = 0
                self._cond.notify_all()
