"""Progress for long operator commands: a rich bar with events/s and ETA on a terminal,
plain progress lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

PLAIN_EVERY_SECONDS = 2.0
Update = Callable[..., None]


@contextmanager
def progress_reporter(label: str) -> Iterator[Update]:
    """Yields ``update(done, total, counted=None)``; the rate is ``counted`` (default ``done``) per second."""
    started = time.perf_counter()
    if sys.stderr.isatty():
        with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[rate]:>10,.0f} events/s"), TimeRemainingColumn()) as bar:
            task = bar.add_task(label, total=None, rate=0.0)

            def update(done: int, total: int, counted: int | None = None) -> None:
                elapsed = max(time.perf_counter() - started, 1e-9)
                bar.update(task, completed=done, total=total, rate=(done if counted is None else counted) / elapsed)

            yield update
        return

    last = [0.0]

    def update_plain(done: int, total: int, counted: int | None = None) -> None:
        now = time.perf_counter()
        if now - last[0] < PLAIN_EVERY_SECONDS and done < total:
            return
        last[0] = now
        elapsed = max(now - started, 1e-9)
        rate = (done if counted is None else counted) / elapsed
        eta = f"{(total - done) / (done / elapsed):.0f} s" if done else "?"
        print(f"{label}: {done}/{total} ({100 * done / max(total, 1):.0f}%), {rate:,.0f} events/s, ETA {eta}",
              file=sys.stderr, flush=True)

    yield update_plain
