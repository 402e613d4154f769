"""Group read: the reads before concurrent commands (each the key's record and the stream, ``StreamReads.
read_for_command``) go out together, many per round trip (``StreamReads.read_many``), as ``group_commit`` does for
their appends. A round trip's client cost (a pooled connection, the pipeline, the socket's system calls, a wake-up)
is most of a read's, and the server's too; shared by several reads it is paid once.

No thread of its own: a reading thread that finds a slot free leads, sends what is queued (its own read first in
line or behind earlier ones), hands every reader its own result, then wakes the next. While a round trip is in
flight, the next readers queue. A lone reader waits for nobody. Each read is its own statement and implicit
transaction, as alone, so batching changes no result. A round trip that fails (the server gone, shutting down,
in recovery) fails every read in it with ``StoreUnavailable``, as it would have failed each alone.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Sequence

from commitline.infrastructure.store.group_commit import Sleeper
from commitline.infrastructure.store.streams import CommandRead, ReadArgs, StreamReads

#: At most this many reads per round trip.
MAX_BATCH = 32


class _Read:
    __slots__ = ("args", "outcome", "done", "sleeper")

    def __init__(self, args: ReadArgs, sleeper: Sleeper):
        self.args = args
        self.outcome: CommandRead | BaseException | None = None
        self.done = False
        self.sleeper = sleeper


class GroupReader:
    """Coalesces ``read`` calls from concurrent threads into ``read_many`` round trips, at most ``slots`` in flight."""

    def __init__(self, reads: StreamReads, *, max_batch: int = MAX_BATCH, slots: int = 2) -> None:
        """``reads``: the recorder; a lone read goes through its ``read_for_command``, several through its
        ``read_many``."""
        self._reads = reads
        self.max_batch = max_batch
        self._free = slots
        self._queue: deque[_Read] = deque()
        self._done: deque[Sleeper] = deque()  # readers answered but still asleep: woken one by one
        self._lock = threading.Lock()

    def read(self, args: ReadArgs) -> CommandRead:
        """What ``read_for_command`` with ``args`` finds; raises what failed its round trip."""
        sleeper = Sleeper(1)
        mine = _Read(args, sleeper)
        with self._lock:
            self._queue.append(mine)
        while not mine.done:
            batch = self._lead()
            if batch is None:
                self._wake_next()
                sleeper.sleep(self._lock)
            else:
                self._run(batch, sleeper)
        self._wake_next()
        if isinstance(mine.outcome, BaseException):
            raise mine.outcome
        return mine.outcome  # type: ignore[return-value]

    def _wake_next(self) -> None:
        """Wake one answered reader (as ``GroupCommitter._wake_next``: one at a time, each passing the turn on)."""
        with self._lock:
            if self._done:
                self._done.popleft().signal()

    def _lead(self) -> list[_Read] | None:
        with self._lock:
            if not self._free or not self._queue:
                return None
            self._free -= 1
            return [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]

    def _run(self, batch: list[_Read], leader: Sleeper) -> None:
        try:
            if len(batch) == 1:
                outcomes: Sequence[CommandRead | BaseException] = [self._reads.read_for_command(*batch[0].args)]
            else:
                outcomes = self._reads.read_many([r.args for r in batch])
        except BaseException as e:  # the round trip failed (connection lost, store down): every read fails
            outcomes = [e] * len(batch)
        with self._lock:
            self._free += 1
            for read, outcome in zip(batch, outcomes, strict=True):
                read.outcome, read.done = outcome, True
                if read.sleeper is not leader:
                    self._done.append(read.sleeper)
            if self._done:
                self._done.popleft().signal()
            for waiting in itertools.islice(self._queue, self._free):
                waiting.sleeper.signal()  # the next in line lead
