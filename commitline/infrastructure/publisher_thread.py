"""Running a KafkaPublisher in a background thread with its own event loop, for programs that
are not asyncio themselves (the demo, benchmarks, tests)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from commitline.infrastructure.publisher import KafkaPublisher


class PublisherThread:
    def __init__(self, make_publisher: Callable[[], KafkaPublisher]):
        self._make = make_publisher
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self.publisher: KafkaPublisher | None = None
        self._thread = threading.Thread(target=self._main, name="commitline-publisher", daemon=True)

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.publisher = self._make()
            self._ready.set()
            await self.publisher.run(self._stop)

        try:
            asyncio.run(run())
        except BaseException as e:  # re-raised by stop() and wait_until_published()
            self.error = e
            self._ready.set()

    def start(self) -> PublisherThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("publisher thread did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        if self._thread.is_alive():
            raise RuntimeError("publisher did not stop within 60 s")
        if self.error is not None:
            raise self.error

    def __enter__(self) -> PublisherThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_until_published(self, position: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise self.error
            if self.publisher is not None and self.publisher.metrics.position >= position:
                return
            time.sleep(0.02)
        at = self.publisher.metrics.position if self.publisher else None
        raise TimeoutError(f"publisher did not reach position {position} in {timeout} s (at {at})")
