"""Reading the gap-safe log for a follower's slots, a page at a time (``engine.py`` runs it).

One slot (a plain follower) reads the whole log after its position. Buckets (a publish instance) are read
in one read of the bucket log (``store/log.py``), each after its own position, with a second read of
their own for buckets far behind the others (a read starting at them would hold back everybody else until
they caught up); the page says how far each bucket's read is proven (``through``), so a bucket without new
events still moves on. Reads run in a worker thread, where the follower's ``prepare`` works on the page
too; with ``read_ahead`` the next page is read (and prepared) while this one is handled, and used if the
next round starts from the positions it was read from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eventsourcing.persistence import Notification

from commitline.infrastructure.store.log import BucketLog
from commitline.infrastructure.store.recorder import EventRecorder


@dataclass
class Page:
    """One read: each slot's events, how far each slot's read is proven (a watermark past the page's last
    event when the log holds nothing more), whether the read was full, and what ``prepare`` made of it."""

    events: dict[int, list[Notification]]
    through: dict[int, int]
    full: bool
    prepared: Any = None


class PageReader:
    def __init__(self, recorder: EventRecorder, log: BucketLog | None, batch_size: int,
                 prepare: Callable[[Page, Mapping[int, int]], Any], read_ahead: bool):
        self.recorder = recorder
        self.log = log
        self.batch_size = batch_size
        self.prepare = prepare
        self.read_ahead = read_ahead
        self._prefetch: tuple[dict[int, int], asyncio.Task[Page]] | None = None  # positions, their next page

    async def read(self, active: dict[int, int]) -> Page:
        """The page read ahead during the last round if it was read from these very positions, else a new
        one; with ``read_ahead``, the next page is read meanwhile when this one was full."""
        prefetch, self._prefetch = self._prefetch, None
        page = None
        if prefetch is not None:
            positions, task = prefetch
            if positions == active:
                page = await task
            else:
                _abandon(task)
        if page is None:
            page = await asyncio.to_thread(self._read_page, active)
        if self.read_ahead and page.full:
            following = {s: max(p, page.through[s]) for s, p in active.items()}
            self._prefetch = (following, asyncio.get_running_loop().create_task(
                asyncio.to_thread(self._read_page, following)))
        return page

    def forget(self) -> None:
        """Drop the page read ahead (the slots are changing hands)."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            _abandon(prefetch[1])

    def _read_page(self, active: dict[int, int]) -> Page:
        if self.log is None:
            (slot, position), = active.items()
            batch = self.recorder.select_notifications(position + 1, self.batch_size)
            page = Page({slot: batch} if batch else {}, {slot: batch[-1].id if batch else position},
                        len(batch) >= self.batch_size)
        else:
            ahead = max(active.values()) - self.batch_size
            page = Page({}, {}, False)
            for cohort in ({s: p for s, p in active.items() if p >= ahead}, {s: p for s, p in active.items() if p < ahead}):
                if not cohort:
                    continue
                read = self.log.read(cohort, self.batch_size)
                page.full = page.full or read.full
                for s, position in cohort.items():
                    page.through[s] = max(position, read.through)
                for n, s in zip(read.notifications, read.buckets):
                    page.events.setdefault(s, []).append(n)
        page.prepared = self.prepare(page, active)
        return page


def _abandon(task: asyncio.Task[Page]) -> None:
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody waits for it
