"""Progress for long operator commands: a rich bar with events/s and ETA on a terminal,
plain progress lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

PLAIN_EVERY_SECONDS = 2.0


@contextmanager
def rebuild_progress(name: str) -> Iterator[Callable[[int, int, int], None]]:
    """Yields ``update(position, head, applied)``."""
    started = time.perf_counter()
    if sys.stderr.isatty():
        with Progress(TextColumn(f"rebuild {name}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[rate]:>10,.0f} events/s"), TimeRemainingColumn(),
                      transient=False) as bar:
            task = bar.add_task(name, total=None, rate=0.0)

            def update(position: int, head: int, applied: int) -> None:
                elapsed = max(time.perf_counter() - started, 1e-9)
                bar.update(task, completed=position, total=head, rate=applied / elapsed)

            yield update
        return

    last = [0.0]

    def update_plain(position: int, head: int, applied: int) -> None:
        now = time.perf_counter()
        if now - last[0] < PLAIN_EVERY_SECONDS and position < head:
            return
        last[0] = now
        elapsed = max(now - started, 1e-9)
        rate = applied / elapsed
        eta = (head - position) / (position / elapsed) if position else float("nan")
        print(f"rebuild {name}: position {position}/{head} ({100 * position / max(head, 1):.0f}%), "
              f"{rate:,.0f} events/s, ETA {eta:.0f} s", file=sys.stderr, flush=True)

    yield update_plain
