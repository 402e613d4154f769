"""Bounded exponential back-off with full jitter, for re-running a command after a conflict."""

from __future__ import annotations

from dataclasses import dataclass

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential


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

    def retrying(self, retry_on: type[BaseException]) -> Retrying:
        """At most ``max_attempts`` runs while ``retry_on`` is raised, then that error is re-raised; the
        pause before retry n (from 1) is uniform in [0, min(max_delay, base_delay * 2**(n-1))]."""
        return Retrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_random_exponential(multiplier=self.base_delay, max=self.max_delay),
            retry=retry_if_exception_type(retry_on),
            reraise=True,
        )
