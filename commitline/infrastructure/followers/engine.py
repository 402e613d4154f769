"""The one follower loop: own the lease, read a batch, handle it, save the position, wait.

Every follower of the notification log (the Kafka publisher, each projector, each process
manager's runner, a rebuild) is a ``Follower`` that says only two things:

- ``handle(batch, position)``: what one batch does, returning where it got to (``Handled``);
  a handler that writes its position in its own transaction says so (``saved=True``), and
  one that met a poison event returns it (``poison=...``) and the loop then waits for an
  operator's ``retry`` or ``skip``;
- its failure policy: ``retry_on`` lists the errors after which the same batch is tried
  again with bounded, jittered exponential back-off (``outage.py``), status ``retrying`` while
  it lasts, logged once when it starts and once when it ends; anything else propagates.

The loop does the rest: waits for the lease (polling, so a standby never blocks the owner),
reads the gap-safe log after the saved position, saves the position only after ``handle``
returned (on the lease connection, so a lost lease cannot move it), yields the lease when a
rebuild waits for it (``yields_to_waiters``), sleeps on LISTEN/NOTIFY or the poll interval,
re-acquires after a lost lease, and releases everything on the way out. While PostgreSQL
cannot be used (``StoreUnavailable``) it lets the lease go and tries again with bounded,
jittered exponential back-off, logging the outage once when it starts and once when it ends.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eventsourcing.persistence import Notification

from commitline.application.errors import StoreUnavailable
from commitline.infrastructure.followers.lease import Lease, LeaseLost, instance_id
from commitline.infrastructure.followers.outage import Outage
from commitline.infrastructure.followers.wakeup import LogWakeup, wait_or_stop
from commitline.infrastructure.store.recorder import EventRecorder

log = logging.getLogger(__name__)
LEASE_POLL_SECONDS = 0.5
OPERATOR_POLL_SECONDS = 1.0
GAP_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Handled:
    position: int  # the last notification handled (the position to save)
    saved: bool = False  # the handler already wrote the position, in its own transaction
    poison: dict[str, Any] | None = None  # stopped before this event; waits for an operator


class Follower:
    """A follower of the notification log; subclasses supply ``handle`` and their failure policy."""

    retry_on: tuple[type[BaseException], ...] = ()
    outage_subject = ""  # what is failing, for the two outage log lines (default: the lease name)
    yields_to_waiters = False
    metrics: Any  # has .position

    def __init__(self, recorder: EventRecorder, conninfo: dict[str, Any], name: str, *, batch_size: int,
                 poll_interval: float, owner: str | None = None, max_backoff: float = 10.0):
        self.recorder = recorder
        self.conninfo = conninfo
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.owner = owner or instance_id()
        self.lease = Lease(conninfo, recorder.datastore.schema, name, self.owner)
        self.wakeup = LogWakeup(conninfo, recorder.channel_name)
        self.on_caught_up: Callable[[], None] | None = None  # e.g. ``publish --drain`` stops here
        self.on_poisoned: Callable[[], None] | None = None  # stopped at a poison event (``--drain`` stops too)
        self.waiting_for_operator = False
        follower_log = logging.getLogger(type(self).__module__)  # outages are logged under the follower's name
        self.outage = Outage(follower_log, self.outage_subject or name, max_backoff)
        self.store_outage = Outage(follower_log, f"{name}: PostgreSQL", max_backoff)

    # -- what a follower supplies ------------------------------------------------------

    async def handle(self, batch: Sequence[Notification], position: int) -> Handled:
        raise NotImplementedError

    async def on_owner(self) -> None:
        """Prepare to work, once the lease is taken (e.g. create a projection's tables)."""

    async def on_failure(self, error: BaseException, attempt: int) -> None:
        """Called before each back-off after a ``retry_on`` error (e.g. drop a broken producer)."""

    async def on_saved(self, batch: Sequence[Notification], handled: Handled) -> None:
        """Called after the position of a handled batch was saved (counting, callbacks)."""

    async def on_stop(self) -> None:
        """Release what the follower holds besides its lease (e.g. a Kafka producer)."""

    # -- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the log while owning the lease, until ``stop`` is set."""
        # A follower allocates many short-lived objects per batch; moving everything that exists at
        # start-up out of the collector's reach keeps full collections short (measured: ~20% of the
        # publisher's time went to GC without this).
        gc.freeze()
        try:
            while not stop.is_set():
                try:
                    if not await asyncio.to_thread(self.lease.try_acquire):
                        self.store_outage.recovered()
                        await wait_or_stop(stop, LEASE_POLL_SECONDS)
                        continue
                    await self._work_while_owner(stop)
                except LeaseLost as e:
                    log.error("%s; waiting to own %s again", e, self.lease.name)
                except StoreUnavailable as e:  # let the lease go: another instance may reach the store
                    delay = self.store_outage.failed(e)
                    await asyncio.to_thread(self.lease.release, "retrying")
                    await wait_or_stop(stop, delay)
        finally:
            await self.on_stop()
            await self.wakeup.close()
            await asyncio.to_thread(self.lease.release)

    async def _work_while_owner(self, stop: asyncio.Event) -> None:
        await self.on_owner()
        position, status = await asyncio.to_thread(self.lease.own_row)
        self.metrics.position = position
        log.info("%s: %s active from position %d", self.lease.name, self.owner, position)
        while not stop.is_set():
            if self.yields_to_waiters and await asyncio.to_thread(self.lease.has_waiters):
                log.info("%s: yielding the lease to a rebuild", self.lease.name)
                await asyncio.to_thread(self.lease.release, "yielded")
                await wait_or_stop(stop, OPERATOR_POLL_SECONDS)
                return
            self.waiting_for_operator = status == "failed"
            if status == "failed":  # stopped at a poison event: wait for an operator's retry or skip
                if self.on_poisoned is not None:
                    self.on_poisoned()
                await wait_or_stop(stop, OPERATOR_POLL_SECONDS)
                position, status = await asyncio.to_thread(self.lease.own_row)
                continue
            handled = await self.step(self.lease, position, stop)
            self.store_outage.recovered()
            if handled is None:
                if self.on_caught_up is not None and await self._caught_up(position):
                    self.on_caught_up()
                    if stop.is_set():
                        continue
                await self.wakeup.wait(self.poll_interval)
                continue
            position = handled.position
            if handled.poison is not None:
                status = "failed"
                log.critical("%s stopped at poison event %s: %s", self.lease.name, handled.poison["position"],
                             handled.poison["message"])

    async def step(self, lease: Lease, position: int, stop: asyncio.Event | None = None) -> Handled | None:
        """Read, handle and save one batch after ``position``; None when there was nothing to read."""
        batch = await asyncio.to_thread(self.recorder.select_notifications, position + 1, self.batch_size)
        if not batch:
            return None
        handled = await self._handle_retrying(batch, position, lease, stop or asyncio.Event())
        if handled is None:  # asked to stop during an outage
            return Handled(position, saved=True)
        if not handled.saved:
            await asyncio.to_thread(lease.save_position, handled.position, handled.poison)
        self.metrics.position = handled.position
        await self.on_saved(batch, handled)
        return handled

    async def catch_up(self, lease: Lease, position: int,
                       progress: Callable[[int, int], None] | None = None) -> int:
        """Handle batches until the log head is reached; returns the position then."""
        while True:
            handled = await self.step(lease, position)
            head = await asyncio.to_thread(self.recorder.max_notification_id) or 0
            if handled is None:
                if head <= position:
                    return position
                await asyncio.sleep(GAP_POLL_SECONDS)  # a gap still being proven at the head
                continue
            position = handled.position
            if progress is not None:
                progress(position, head)

    async def _caught_up(self, position: int) -> bool:
        # An empty read can also mean a gap still being proven; only the head tells them apart.
        head = await asyncio.to_thread(self.recorder.max_notification_id)
        return (head or 0) <= position

    async def _handle_retrying(self, batch: Sequence[Notification], position: int, lease: Lease,
                               stop: asyncio.Event) -> Handled | None:
        """``handle`` the batch, trying it again after each ``retry_on`` error; None if stopped meanwhile."""
        while True:
            try:
                handled = await self.handle(batch, position)
            except self.retry_on as error:
                delay = self.outage.failed(error, f" at position {batch[0].id}")
                await asyncio.to_thread(lease.set_status, "retrying",
                                        {"message": f"{type(error).__name__}: {error}", "position": batch[0].id})
                await self.on_failure(error, self.outage.failures)
                await wait_or_stop(stop, delay)
                if stop.is_set():
                    return None
                continue
            self.outage.recovered()
            return handled
