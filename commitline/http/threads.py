"""The threads that run the HTTP API's blocking calls (``POST /v1/commands``: the API key's read, then
``dispatch``), and the one hand-off from the event loop to them and back.

``BlockingCalls(n)(func, *args)`` is an awaitable future of ``func(*args)``, run by one of at most ``n``
threads in a copy of the caller's context (so the request's trace span is the parent of the command's). It
does what ``loop.run_in_executor`` with a ``ThreadPoolExecutor`` does, with less on the way: the call is put
on one queue that idle threads wait on, and its outcome is set on the loop's own future by one
``call_soon_threadsafe``. ``run_in_executor`` makes a ``concurrent.futures.Future`` per call, chains it to an
asyncio future with callbacks on both sides, and takes the executor's locks and semaphore; on the serving
process's one core, shared by the event loop and every dispatch under one interpreter lock, that came to
about a third of the loop's cost per command (``docs/benchmarks.md``).

Threads are started as calls wait for one, up to ``n``; they are daemon threads that outlive nothing: the
server answers every request in flight before it shuts down, and an idle thread holds nothing. A call whose
caller stopped waiting (its request cancelled) still runs to its end, like a thread pool's: its outcome is
dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

T = TypeVar("T")

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context, Callable[..., Any], tuple[Any, ...]]


class BlockingCalls:
    """At most ``threads`` threads running blocking calls for event loops; calling it hands one over."""

    def __init__(self, threads: int, name: str):
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.limit = threads
        self.name = name
        self._calls: SimpleQueue[_Call] = SimpleQueue()
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0  # threads waiting for a call (changed under the lock)

    def __call__(self, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._idle:
                self._idle -= 1  # this call is that thread's: the next one finds it taken
            elif self._started < self.limit:
                self._start()
        self._calls.put((loop, future, contextvars.copy_context(), func, args))
        return future

    @property
    def threads(self) -> int:
        """Threads started so far."""
        return self._started

    def _start(self) -> None:
        self._started += 1
        threading.Thread(target=self._serve, name=f"{self.name}_{self._started - 1}", daemon=True).start()

    def _serve(self) -> None:
        take = self._calls.get
        while True:
            call = take()
            loop, future, context, func, args = call
            try:
                _hand_back(loop, future, _set_result, context.run(func, *args))
            except BaseException as error:  # noqa: BLE001 - every outcome goes back to the caller as it is
                _hand_back(loop, future, _set_exception, error)
            del call, loop, future, context, func, args  # nothing of the call held while idle
            with self._lock:
                self._idle += 1


def _hand_back(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], settle: Callable[..., None],
               value: Any) -> None:
    try:
        loop.call_soon_threadsafe(settle, future, value)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.cancelled():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.cancelled():
        future.set_exception(error)
