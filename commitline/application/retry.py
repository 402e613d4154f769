"""Bounded exponential back-off with full jitter, for re-running a command after a conflict."""

from __future__ import annotations

from dataclasses import dataclass

from tenacity import RetryCallState, wait_random_exponential


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 10
    base_delay: float = 0.005
    max_delay: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0 <= self.base_delay <= self.max_delay:
            raise ValueError("need 0 <= base_delay <= max_delay")

    def pause(self, retry: int) -> float:
        """Seconds to wait before re-run ``retry`` (from 1): uniform in [0, min(max_delay, base_delay * 2**(retry-1))]
        (tenacity's ``wait_random_exponential``). The caller loops itself: building a tenacity ``Retrying`` for
        every dispatch cost measurable time on the hot path, and only re-runs need a pause."""
        state = RetryCallState(None, None, (), {})
        state.attempt_number = retry
        return wait_random_exponential(multiplier=self.base_delay, max=self.max_delay)(state)
