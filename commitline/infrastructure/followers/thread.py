"""Running a follower (the Kafka publisher, a projector) in a background thread with its own
event loop, for programs that are not asyncio themselves (the demo, benchmarks, tests)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol


class Follower(Protocol):
    metrics: Any  # has .position

    async def run(self, stop: asyncio.Event) -> None: ...


class FollowerThread:
    def __init__(self, make_follower: Callable[[], Follower]):
        self._make = make_follower
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self.follower: Any = None
        self._thread = threading.Thread(target=self._main, name="commitline-follower", daemon=True)

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.follower = self._make()
            self._ready.set()
            await self.follower.run(self._stop)

        try:
            asyncio.run(run())
        except BaseException as e:  # re-raised by stop() and wait_until_published()
            self.error = e
            self._ready.set()

    def start(self) -> FollowerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("follower thread did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        if self._thread.is_alive():
            raise RuntimeError("follower did not stop within 60 s")
        if self.error is not None:
            raise self.error

    def __enter__(self) -> FollowerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_until_at(self, position: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise self.error
            if self.follower is not None and self.follower.metrics.position >= position:
                return
            time.sleep(0.02)
        at = self.follower.metrics.position if self.follower else None
        raise TimeoutError(f"follower did not reach position {position} in {timeout} s (at {at})")
