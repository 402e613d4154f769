"""Driving writers through a measured window (measures nothing itself; each benchmark names its baseline).

- :class:`Measurement`: commands/s in the window, each completed command's latency, the errors;
- :func:`drive`: n writer threads released together, each looping its command until the window ends, every
  one of them on one CPU when asked; ``ready`` lets several processes start their windows together.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.harness import run_together


@dataclass
class Measurement:
    rate: float  # commands/s in the measured window
    latencies: list[float] = field(default_factory=list)  # seconds, commands completed in the window
    errors: int = 0
    first_error: BaseException | None = None

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def drive(writers: int, command: Callable[[int, int], Any], warmup: float, duration: float,
          cpu: int | None = None, ready: Callable[[], None] | None = None) -> Measurement:
    """Each writer i loops command(i, seq) until the window ends; count what completes inside it. With ``cpu``,
    every writer thread first moves to that CPU (``os.sched_setaffinity``), as commitline's own
    ``COMMITLINE_DISPATCH_CPU`` moves its dispatching threads. ``ready`` is called once every writer is set
    up, before the warm-up starts (it may block: a process waiting for the others)."""
    window: dict[str, float] = {}

    def set_window() -> None:
        if ready is not None:
            ready()
        now = time.perf_counter()
        window["start"] = now + warmup
        window["end"] = now + warmup + duration

    def loop(i: int) -> tuple[list[float], int, BaseException | None]:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})  # this writer thread only: the next measurement's threads start free
        start, end = window["start"], window["end"]
        latencies: list[float] = []
        errors, first_error = 0, None
        for seq in itertools.count():
            t0 = time.perf_counter()
            if t0 >= end:
                break
            try:
                command(i, seq)
            except Exception as e:
                errors += 1
                first_error = first_error or e
                continue
            t1 = time.perf_counter()
            if start <= t1 <= end:
                latencies.append(t1 - t0)
        return latencies, errors, first_error

    outcomes = run_together(writers, loop, action=set_window, timeout=warmup + duration + 120)
    result = Measurement(0.0)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        latencies, errors, first_error = outcome
        result.latencies.extend(latencies)
        result.errors += errors
        result.first_error = result.first_error or first_error
    result.rate = len(result.latencies) / duration
    return result
