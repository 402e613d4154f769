"""Bounded exponential back-off with full jitter, for re-running a command after a conflict."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


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

    def delays(self) -> Iterator[float]:
        """The pause before each retry: ``max_attempts - 1`` values, each uniform in [0, cap]."""
        for attempt in range(self.max_attempts - 1):
            yield random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))
