"""A wake-up that can be shared and poked: ``SharedWakeup``.

One LISTEN connection, listened to by a background task; every NOTIFY wakes every waiter (a
``WakeupView`` each), and a waiter that was busy when one arrived does not wait for the next (the
view counts them). ``poke`` wakes the waiters without a NOTIFY: the publish instance's rebalancing
wakes its publishing loop that way when it took a bucket or is stopping.
"""

from __future__ import annotations

import asyncio
from typing import Any

from commitline.infrastructure.followers.wakeup import LogWakeup

LISTEN_TIMEOUT_SECONDS = 1.0


class SharedWakeup:
    def __init__(self, conninfo: dict[str, Any], channel: str):
        self._listener = LogWakeup(conninfo, channel)
        self.generation = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def view(self) -> WakeupView:
        return WakeupView(self)

    async def _listen(self) -> None:
        while True:
            if await self._listener.wait(LISTEN_TIMEOUT_SECONDS):
                self.poke()

    def poke(self) -> None:
        """Wake every worker now (one to stop, say); the others read once more and wait again."""
        self.generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        await self._listener.close()


class WakeupView:
    """One worker's wake-up (``LogWakeup``'s interface)."""

    def __init__(self, shared: SharedWakeup):
        self.shared = shared
        self.seen = shared.generation

    async def wait(self, timeout: float) -> bool:
        """True if a NOTIFY arrived since the last call or within ``timeout`` seconds."""
        shared = self.shared
        shared._started()
        if shared.generation == self.seen:
            try:
                await asyncio.wait_for(shared._changed.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        woke, self.seen = shared.generation != self.seen, shared.generation
        return woke

    async def close(self) -> None:
        """The shared listener is closed by its owner."""
