"""What the bucket workers of one instance share instead of holding one each: the wake-up and outages.

- ``SharedWakeup``: one LISTEN connection for all of them; every NOTIFY wakes every worker, and a
  worker that was busy when one arrived does not wait for the next (``WakeupView`` counts them).
- ``SharedOutage``: one outage of a dependency (the broker, PostgreSQL) as an operator sees it: logged
  once when the first worker starts failing and once when the last one recovers, however many
  workers and attempts fail in between; each worker keeps its own back-off (``outage.py``'s).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tenacity import RetryCallState, wait_random_exponential

from commitline.infrastructure.followers.outage import FIRST_BACKOFF_SECONDS
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


class SharedOutage:
    def __init__(self, log: logging.Logger, subject: str, max_backoff: float):
        self.log = log
        self.subject = subject
        self.max_backoff = max_backoff
        self.failing: set[str] = set()
        self.attempts = 0
        self._since = 0.0

    def member(self, key: str) -> MemberOutage:
        return MemberOutage(self, key)


class MemberOutage:
    """One worker's part of a ``SharedOutage`` (``outage.Outage``'s interface)."""

    def __init__(self, shared: SharedOutage, key: str):
        self.shared = shared
        self.key = key
        self.failures = 0
        self._wait = wait_random_exponential(multiplier=FIRST_BACKOFF_SECONDS, max=shared.max_backoff)

    def failed(self, error: BaseException, where: str = "") -> float:
        shared = self.shared
        if not shared.failing:
            shared._since = time.monotonic()
            shared.attempts = 0
            shared.log.error("%s unavailable (%s: %s)%s; retrying with back-off up to %.1f s", shared.subject,
                             type(error).__name__, error, where, shared.max_backoff)
        shared.failing.add(self.key)
        shared.attempts += 1
        self.failures += 1
        state = RetryCallState(None, None, (), {})
        state.attempt_number = self.failures
        return self._wait(state)

    def recovered(self) -> None:
        if not self.failures:
            return
        self.failures = 0
        shared = self.shared
        shared.failing.discard(self.key)
        if not shared.failing:
            shared.log.warning("%s available again after %.1f s and %d failed attempts; catching up", shared.subject,
                               time.monotonic() - shared._since, shared.attempts)
