"""Group commit: the appends of concurrent dispatches go out together, one transaction and one round
trip (``EventRecorder.append_batch``) per batch, so one fsync acknowledges many commands.

No thread of its own: a dispatching thread that finds a flush slot free becomes the leader, takes
what is queued (its own append first in line or behind earlier ones), runs the batch, hands every
command its own outcome, then wakes the next waiting one to lead. Batches form by themselves: while
one is in flight (its fsync), the next arrivals queue. A lone writer waits for nobody.

Each command stays atomic on its own: its refusal (``StreamMoved``, ``KeyAlreadyRecorded``) is its
own, the others commit. A command is acknowledged only after its batch's COMMIT succeeded; if the
batch's transaction fails (connection lost, store down) every command in it gets that failure, which
means "retry with the same key", exactly as for a lone append.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from commitline.infrastructure.store.recorder import EventRecorder, PendingAppend

#: At most this many commands per transaction: each holds a subtransaction, and PostgreSQL keeps up to
#: 64 per backend in shared memory before every other snapshot gets slower.
MAX_BATCH = 48
MAX_BATCH_BYTES = 4 * 1024 * 1024


class Sleeper:
    """One ``append_many`` call's thread (or ``group_read``'s reader's), asleep on a bare lock (cheaper than an
    Event's condition): ``signal`` (under the committer's lock) wakes it once however often it is called before
    it wakes."""

    __slots__ = ("_lock", "_signalled", "undecided")

    def __init__(self, undecided: int) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._signalled = False
        self.undecided = undecided  # of its appends (changed under the committer's lock)

    def signal(self) -> None:
        if not self._signalled:
            self._signalled = True
            self._lock.release()

    def sleep(self, committer_lock: threading.Lock) -> None:
        self._lock.acquire()
        with committer_lock:
            self._signalled = False  # before the caller looks at the state again: no wake-up is lost


class _Waiter:
    __slots__ = ("pending", "outcome", "done", "call")

    def __init__(self, pending: PendingAppend, call: Sleeper):
        self.pending = pending
        self.outcome: list[int] | BaseException | None = None
        self.done = False
        self.call = call  # shared by the waiters of one call: a signal to any of them reaches its thread


class GroupCommitter:
    """Coalesces ``append`` calls from concurrent threads into ``append_batch`` transactions, with at most
    ``flushers`` batches in flight at once."""

    def __init__(self, recorder: EventRecorder, *, max_batch: int = MAX_BATCH, flushers: int = 2, tracing: Any = None):
        if not 1 <= max_batch <= 60:
            raise ValueError("max_batch must be between 1 and 60")
        self.recorder = recorder
        self.tracing = tracing  # ``infrastructure/tracing.Tracing``: a span per batch, linked with its appends
        self.max_batch = max_batch
        self._free = flushers
        self._queue: deque[_Waiter] = deque()
        self._done: deque[Sleeper] = deque()  # calls decided but still asleep: woken one by one (below)
        self._lock = threading.Lock()

    def append(self, pending: PendingAppend) -> list[int]:
        """Store one command's append in the next batch; its notification ids, or raise what refused it."""
        return self.append_many([pending])[0]  # type: ignore[return-value]

    def append_many(self, pendings: Sequence[PendingAppend]) -> list[list[int] | BaseException]:
        """Several commands' appends, queued together (so they share a batch when they fit in one):
        per command its ids or what refused it. Returns once every one of them is decided."""
        call = Sleeper(len(pendings))
        mine = [_Waiter(p, call) for p in pendings]
        with self._lock:
            self._queue.extend(mine)
        for waiter in mine:
            while not waiter.done:
                batch = self._lead()
                if batch is None:
                    self._wake_next()  # this thread stops running Python: a decided one takes its turn
                    call.sleep(self._lock)
                else:
                    self._flush(batch, call)
        self._wake_next()
        return [w.outcome for w in mine]  # type: ignore[misc]

    def _wake_next(self) -> None:
        """Wake one decided call. A batch's threads are woken one after the other, each by a thread that
        returns or goes to sleep, not all at once: only one of them could run Python at a time anyway,
        and the others would only wake to queue for the interpreter lock and sleep again (a context switch
        each). Every thread that stops running passes the turn on, so no decided call is left asleep."""
        with self._lock:
            if self._done:
                self._done.popleft().signal()

    def _lead(self) -> list[_Waiter] | None:
        """Take a flush slot and the batch at the head of the queue, if a slot is free."""
        with self._lock:
            if not self._free or not self._queue:
                return None
            self._free -= 1
            batch, size = [], 0
            while self._queue and len(batch) < self.max_batch:
                nxt = self._queue[0].pending.size
                if batch and size + nxt > MAX_BATCH_BYTES:
                    break
                batch.append(self._queue.popleft())
                size += nxt
            return batch

    def _flush(self, batch: list[_Waiter], leader: Sleeper) -> None:
        try:
            if self.tracing is None:
                outcomes: Sequence[list[int] | BaseException] = self.recorder.append_batch([w.pending for w in batch])
            else:
                traced = [w.pending.trace for w in batch if w.pending.trace is not None]
                with self.tracing.batch(traced, len(batch)):
                    outcomes = self.recorder.append_batch([w.pending for w in batch])
        except BaseException as e:  # the whole transaction failed: nobody's command is acknowledged
            outcomes = [e] * len(batch)
        with self._lock:
            self._free += 1
            for waiter, outcome in zip(batch, outcomes, strict=True):
                waiter.outcome, waiter.done = outcome, True
                waiter.call.undecided -= 1
                if not waiter.call.undecided and waiter.call is not leader:
                    self._done.append(waiter.call)  # once per call: each entry is one thread to wake
            if self._done:
                self._done.popleft().signal()  # the first of the chain (see ``_wake_next``)
            for waiter in itertools.islice(self._queue, self._free):
                waiter.call.signal()  # the next in line lead
