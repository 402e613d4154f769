"""Whether a long-running follower process is alive: its event loop is running and answers.

A container's health check must say whether *the process* works, so that an orchestrator restarts a hung
process and only that. It must not say anything about the business (a saga waiting for an operator, a
poison event, lag, an unreachable database): restarting a healthy process fixes none of those, and they
are reported by ``commitline status``, ``status --check`` and the metrics. So the probe asks the one
thing a restart can fix: does the event loop that runs every follower of this process still turn? It
schedules a no-op on the loop from the probing thread and waits for it to run.
"""

from __future__ import annotations

import asyncio
import threading

PROBE_TIMEOUT_S = 5.0


class LoopLiveness:
    """Set by the process's follower loop while it runs; probed from another thread (the metrics server)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finished = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop, self._finished = loop, False

    def detach(self) -> None:
        self._loop, self._finished = None, True

    def problem(self, timeout: float = PROBE_TIMEOUT_S) -> str | None:
        """None while the loop answers within ``timeout`` seconds, else why the process is not alive."""
        loop = self._loop
        if loop is None:
            return "the followers have stopped" if self._finished else "the followers have not started yet"
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # closed between the read above and now
            return "the followers have stopped"
        if not answered.wait(timeout):
            return f"the followers' event loop did not answer within {timeout:g} s"
        return None
