"""One outage of something a follower depends on (the broker, a gateway, PostgreSQL).

It is logged once when it begins and once when it ends, however many attempts fail in
between, and it says how long to wait before the next attempt: bounded, jittered
exponential back-off computed by tenacity's ``wait_random_exponential``.
"""

from __future__ import annotations

import logging
import time

from tenacity import RetryCallState, wait_random_exponential

FIRST_BACKOFF_SECONDS = 0.2


def described(error: BaseException) -> str:
    """``Class: message``, once: Kafka's errors put their class name in their message already."""
    text, name = str(error), type(error).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name


class Outage:
    def __init__(self, log: logging.Logger, subject: str, max_backoff: float):
        self.log = log
        self.subject = subject
        self.max_backoff = max_backoff
        self.failures = 0  # in this outage
        self.total_failures = 0  # in every outage since the follower started (its metrics)
        self._since = 0.0
        self._wait = wait_random_exponential(multiplier=FIRST_BACKOFF_SECONDS, max=max_backoff)

    def failed(self, error: BaseException, where: str = "", began: float | None = None) -> float:
        """Count a failed attempt (``began``: when it started, by ``time.monotonic``; the outage is counted from
        the first failed attempt's start, not from its timeout); returns the seconds to wait before the next one."""
        if self.failures == 0:
            self._since = time.monotonic() if began is None else began
            self.log.error("%s unavailable (%s)%s; retrying with back-off up to %.1f s", self.subject,
                           described(error), where, self.max_backoff)
        self.failures += 1
        self.total_failures += 1
        state = RetryCallState(None, None, (), {})
        state.attempt_number = self.failures
        return self._wait(state)

    def recovered(self) -> None:
        """An attempt succeeded: log the end of the outage, if there was one."""
        if self.failures:
            self.log.warning("%s available again after %.1f s and %d failed attempts; catching up", self.subject,
                             time.monotonic() - self._since, self.failures)
            self.failures = 0
