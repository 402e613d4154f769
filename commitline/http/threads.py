"""The threads that run the HTTP API's blocking calls (``POST /v1/commands``: the API key's read, then
``dispatch``), and the one hand-off from the event loop to them and back.

``BlockingCalls(n, name)(func, *args)`` is an awaitable future of ``func(*args)``, run by one of at most ``n``
threads in a copy of the caller's context (so the request's trace span is the parent of the command's). It
does what ``loop.run_in_executor`` with a ``ThreadPoolExecutor`` does, with less on the way: the call is put
on one queue that idle threads wait on, and its outcome is set on the loop's own future by one
``call_soon_threadsafe``. ``run_in_executor`` makes a ``concurrent.futures.Future`` per call, chains it to an
asyncio future with callbacks on both sides, and takes the executor's locks and semaphore. The serving
process's event loop and every dispatch share one core and one interpreter lock, so the hand-off's own cost
counts: 13-16 µs of CPU per call with ``run_in_executor``, about 3 µs with this one (32 callers at once on
uvloop; ``docs/benchmarks.md``).

As with a thread pool:

- threads are started (from the caller's thread, the event loop's: they run on the CPUs it may) as calls
  wait for one, up to ``n``; a thread that cannot be started fails that call and is not counted;
- a call whose caller stopped waiting (its request cancelled) before a thread took it is not run; one already
  running runs to its end and its outcome is dropped;
- the threads end once the ``BlockingCalls`` is gone, or on ``close()``, after the calls already handed over; a
  call after ``close()`` is refused.

Every outcome reaches its caller: an error raised by the call is raised there as it is, except one an
asyncio future cannot carry or that would stop the caller's event loop (``StopIteration``, ``SystemExit``,
``KeyboardInterrupt`` and the other ``BaseException`` subclasses), which arrives as a ``RuntimeError`` caused
by it: a request answers 500, and the server goes on.

The threads are daemon threads. ``commitline serve`` answers every request in flight before it shuts down, for
up to its graceful shutdown's 30 s; a call still running after that is abandoned with the process. Nothing
acknowledged depends on it: its request got no answer, its command committed entirely or not at all, and a
retry with the same ``Idempotency-Key`` answers either way.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

T = TypeVar("T")

#: (the caller's loop, its future, the caller's context, the function, its arguments)
_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context, Callable[..., Any],
              tuple[Any, ...]]


class BlockingCalls:
    """At most ``threads`` threads running blocking calls for event loops; calling it hands one over."""

    def __init__(self, threads: int, name: str):
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self._workers = _Workers(threads, name)
        # The threads hold the workers' state, never this object: once it is gone, they are told to end.
        self.close = weakref.finalize(self, self._workers.stop)

    def __call__(self, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._workers.hand_over((loop, future, contextvars.copy_context(), func, args))
        return future

    @property
    def threads(self) -> int:
        """Threads started so far."""
        return self._workers.started


class _Workers:
    """The queue, the threads serving it, and how many of them wait for a call."""

    def __init__(self, limit: int, name: str):
        self.limit = limit
        self.name = name
        self.calls: SimpleQueue[_Call | None] = SimpleQueue()
        self.lock = threading.Lock()
        self.started = 0
        # Threads waiting for a call, or about to (changed under the lock). Once every thread is started it may
        # count more than there are: a call then waits for whichever thread is free first.
        self.idle = 0
        self.stopped = False

    def hand_over(self, call: _Call) -> None:
        with self.lock:
            if self.stopped:
                raise RuntimeError(f"{self.name}: closed")
            if self.idle:
                self.idle -= 1  # this call is that thread's: the next one finds it taken
            elif self.started < self.limit:
                thread = threading.Thread(target=self.serve, name=f"{self.name}_{self.started}", daemon=True)
                thread.start()  # raises, the call not queued, if no thread can be started now
                self.started += 1
            self.calls.put(call)  # under the lock: never behind the end markers ``stop`` puts

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            threads = self.started
        for _ in range(threads):
            self.calls.put(None)

    def serve(self) -> None:
        take = self.calls.get
        while (call := take()) is not None:
            loop, future, context, func, args = call
            del call
            if future.cancelled():  # its request was cancelled while it waited: not run, as a pool would
                settle: Callable[..., None] | None = None
                value: Any = None
            else:
                try:
                    settle, value = _set_result, context.run(func, *args)
                except BaseException as error:  # noqa: BLE001 - every outcome goes back to its caller
                    settle, value = _set_exception, _carried(error)
            with self.lock:
                self.idle += 1  # before the hand-back: the caller's next call finds this thread
            if settle is not None:
                try:
                    loop.call_soon_threadsafe(settle, future, value)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    pass
            del loop, future, context, func, args, settle, value  # nothing of the call held while idle


def _carried(error: BaseException) -> BaseException:
    """``error`` as its caller receives it: as it is if it is an ordinary ``Exception`` an asyncio future can
    carry; else a ``RuntimeError`` caused by it (``StopIteration`` is refused by ``set_exception``, and
    ``SystemExit`` or ``KeyboardInterrupt`` would stop the event loop awaiting it)."""
    if isinstance(error, Exception) and not isinstance(error, StopIteration):
        return error
    carried = RuntimeError(f"a blocking call raised {type(error).__name__}")  # not str(error): it may raise
    carried.__cause__ = error
    return carried


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.cancelled():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.cancelled():
        future.set_exception(error)
