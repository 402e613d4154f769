"""A subscription to the notification log that polls as well as listening for wake-ups.

eventsourcing's ``PostgresSubscription`` reads again only when a ``NOTIFY`` arrives. Over the
gap-safe log that is not enough: a read that stops before a gap (an id drawn by a transaction
still open, or one that rolled back) has nothing to wake it once the gap resolves, so the next
committed event would wait for yet another write. This one also re-reads every
``poll_interval`` seconds, which passes a gap as soon as it is proven permanent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.postgres import PostgresApplicationRecorder, PostgresSubscription


class PollingSubscription(PostgresSubscription):
    def __init__(self, recorder: PostgresApplicationRecorder, gt: int | None = None, topics: Sequence[str] = (),
                 *, poll_interval: float = 0.25, **kwargs: Any):
        self._poll_interval = poll_interval  # before the base class starts the pulling thread
        super().__init__(recorder=recorder, gt=gt, topics=topics, **kwargs)

    def _loop_on_pull(self) -> None:
        try:
            self._pull()  # already recorded events
            while not self._has_been_stopped:
                self._has_been_notified.wait(timeout=self._poll_interval)
                self._pull()
        except BaseException as e:  # surfaced to the iterating thread, as the base class does
            if self._thread_error is None:
                self._thread_error = e
            self.stop()
