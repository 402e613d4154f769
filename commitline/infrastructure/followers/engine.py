"""The one follower engine: own the work, read, handle, save the positions, wait; for every follower.

A follower owns one or more *slots*, a saved position each. A plain follower (a projector, a process
manager's runner, a rebuild) owns one, through its lease (``lease.py``); a publish instance owns its share
of the buckets, through its group membership (``group.py``), a slot per bucket. A follower subclass says
only what is its own:

- ``handle(batch, position)`` for one slot, or ``handle_page(page, positions)`` for many: what a batch
  does, returning where each slot got to (``Handled``); a handler that writes its position in its own
  transaction says so (``saved=True``), and one that met a poison event returns it (``poison=...``): that
  slot then stops and waits for an operator's ``retry`` or ``skip``, the others go on;
- ``prepare(page, positions)``: work done on a page in the reading thread (the publisher builds its
  records there, so the next page is built while this one is sent, with ``read_ahead``);
- its failure policy: ``retry_on`` lists the errors after which the page is read and tried again with
  bounded, jittered exponential back-off (``outage.py``), its slots ``retrying`` while it lasts, logged once
  when it starts and once when it ends; ``on_failure`` runs before each back-off; anything else ends ``run``;
- ``rebalance()``: the hook a group follower uses to take and hand back slots (``take``, ``hand_back``),
  called between rounds at every supervision tick.

The engine does the rest, the same way for all: joins (the lease or the group, polling, so a standby
never blocks the owner), reads the gap-safe log after each slot's position (the whole log for one slot;
the bucket log for buckets, in one read, with a second read for buckets far behind the others), handles,
saves every moved position in one statement on the fenced connection (so a lost session cannot move
them; a move past other slots' events only is a watermark saved at most once a second), wakes on
LISTEN/NOTIFY or the poll interval, yields the lease to a waiting rebuild (``yields_to_waiters``), resumes
a slot an operator decided on, reports drain (``on_caught_up``/``on_poisoned``), backs off while
PostgreSQL cannot be used (logged once as the outage starts and once as it ends, a broken lease session
being part of it), proves its session still stands before handling a page read after an outage or through a
replaced connection (which may have reached a promoted standby), re-joins after a lost session (or once the store started another generation:
``went_back.py``), and hands everything back on the way out. Slots change hands only between rounds, so a
slot leaves an instance with every event it handled saved: its next owner starts after that position.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eventsourcing.persistence import Notification

from commitline.application.errors import StoreUnavailable
from commitline.infrastructure.followers.fenced import GenerationChanged, LeaseLost, instance_id
from commitline.infrastructure.followers.group import GroupLease
from commitline.infrastructure.followers.lease import Lease
from commitline.infrastructure.followers.outage import Outage, described
from commitline.infrastructure.followers.reading import Page, PageReader
from commitline.infrastructure.followers.shared import SharedWakeup
from commitline.infrastructure.followers.slots import OwnedSlots
from commitline.infrastructure.followers.wakeup import wait_or_stop
from commitline.infrastructure.followers.went_back import is_went_back
from commitline.infrastructure.store.log import BucketLog
from commitline.infrastructure.store.recorder import EventRecorder

log = logging.getLogger(__name__)
OPERATOR_POLL_SECONDS = 1.0  # how often a follower looks at what an operator or a waiting rebuild asks
WAITING_POLL_SECONDS = 5.0  # how often a follower waiting for an operator (``WaitingForOperator``) looks again
GAP_POLL_SECONDS = 0.05
IDLE_SAVE_SECONDS = 1.0  # positions moved past other slots' events only are saved at most this often


class WaitingForOperator(Exception):
    """Raised by ``on_owner``: this follower cannot go on until an operator acts (its status and error, recorded
    before, say what). It lets go of its ownership, so that what the operator runs may take it (a rebuild's
    swap), looks again every ``WAITING_POLL_SECONDS``, and goes on once it can; the process's other followers
    run meanwhile."""


@dataclass(frozen=True)
class Handled:
    position: int  # the last notification handled (the position to save)
    saved: bool = False  # the handler already wrote the position, in its own transaction
    poison: dict[str, Any] | None = None  # stopped before this event; waits for an operator


class Follower(OwnedSlots):
    """A follower of the notification log; subclasses supply the handling and their failure policy."""

    retry_on: tuple[type[BaseException], ...] = ()
    outage_subject = ""  # what is failing, for the two outage log lines (default: the follower's name)
    yields_to_waiters = False
    read_ahead = False  # read (and prepare) the next page while this one is handled
    supervise_seconds = OPERATOR_POLL_SECONDS
    #: whether each page is handled only after the store's generation is read again (it is otherwise read at each
    #: supervision tick): a follower that writes where the generation is part of what it writes (the publisher's
    #: records) must not handle a page read after a new generation began as the old one's
    checks_generation_each_page = False
    metrics: Any  # has .position (a one-slot follower's; see ``moved``)

    def __init__(self, recorder: EventRecorder, conninfo: dict[str, Any], name: str, *, batch_size: int,
                 poll_interval: float, owner: str | None = None, max_backoff: float = 10.0,
                 buckets: int | None = None, logger: logging.Logger | None = None):
        self.recorder = recorder
        self.conninfo = conninfo
        self.name = name
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.owner = owner or instance_id()
        schema = recorder.datastore.schema
        self.lease: Lease | GroupLease
        if buckets is None:
            self.lease = Lease(conninfo, schema, name, self.owner)
        else:
            self.lease = GroupLease(conninfo, schema, name, buckets, self.owner)
        self.reader = PageReader(recorder, None if buckets is None else BucketLog(recorder, buckets), batch_size,
                                 self.prepare, self.read_ahead)
        self.wakeup = SharedWakeup(conninfo, recorder.channel_name)
        self.on_caught_up: Callable[[], None] | None = None  # e.g. ``--drain`` stops here
        self.on_poisoned: Callable[[], None] | None = None  # stopped at a poison event (``--drain`` stops too)
        self.logger = logger or logging.getLogger(type(self).__module__)  # outages are logged under its name
        self.outage = Outage(self.logger, self.outage_subject or name, max_backoff)
        self.store_outage = Outage(self.logger, f"{name}: PostgreSQL", max_backoff)
        self._proven = (False, 0)  # (the session proved since the last outage, connections_lost then)
        OwnedSlots.__init__(self)

    @property
    def log(self) -> BucketLog | None:
        """The bucket log of a group follower (None: one slot, reading the whole log)."""
        return self.reader.log

    @log.setter
    def log(self, log: BucketLog | None) -> None:
        self.reader.log = log

    @property
    def failed_attempts(self) -> int:
        """Attempts that failed and were retried since this follower started: a handler's (the broker down, say)
        and PostgreSQL's (``commitline_follower_errors_total``)."""
        return self.outage.total_failures + self.store_outage.total_failures

    # -- what a follower supplies ------------------------------------------------------

    async def handle(self, batch: Sequence[Notification], position: int) -> Handled:
        raise NotImplementedError

    async def handle_page(self, page: Page, positions: Mapping[int, int]) -> dict[int, Handled]:
        """Handle every slot's events of the page; a one-slot follower's ``handle`` by default."""
        return {slot: await self.handle(batch, positions[slot]) for slot, batch in page.events.items()}

    def prepare(self, page: Page, positions: Mapping[int, int]) -> Any:
        """Work on a page in the reading thread, before ``handle_page`` (its result is ``page.prepared``)."""
        return None

    async def rebalance(self) -> None:
        """Take or hand back slots (a group follower's hook); between rounds, at each supervision tick."""

    async def on_start(self) -> None:
        """Once, before the first join (e.g. start a Kafka producer)."""

    async def on_owner(self) -> None:
        """Prepare to work, once joined (e.g. create a projection's tables)."""

    async def on_failure(self, error: BaseException, attempt: int) -> None:
        """Called before each back-off after a ``retry_on`` error (e.g. drop a broken producer)."""

    async def on_stop(self) -> None:
        """Release what the follower holds besides its ownership (e.g. a Kafka producer)."""

    def moved(self) -> None:
        """Positions moved: a one-slot follower's ``metrics.position`` follows its slot."""
        if 0 in self.slots:
            self.metrics.position = self.slots[0].position

    # -- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the log while owning work, until ``stop`` is set; then finish the round in hand, hand
        everything back and return."""
        # A follower allocates many short-lived objects per batch; moving everything that exists at
        # start-up out of the collector's reach keeps full collections short (measured: ~20% of the
        # publisher's time went to GC without this).
        gc.freeze()
        await self.on_start()
        waiting_because = None
        told_operator = None  # what this follower waits for an operator about, logged once (not every look)
        try:
            while not stop.is_set():
                try:
                    because = await asyncio.to_thread(self.lease.join)
                    self.store_outage.recovered()
                    if because is not None:
                        if because and because != waiting_because:
                            self.logger.error("%s: %s; waiting", self.name, because)
                        waiting_because = because
                        await wait_or_stop(stop, self.lease.join_poll_seconds)
                        continue
                    waiting_because = None
                    await self._own_until(stop)
                    told_operator = None
                except GenerationChanged as e:
                    self.logger.warning("%s: joining again under the new one", e)
                    await self._leave("stopped", "running")
                except LeaseLost as e:
                    delay = 0.0
                    if e.session_failed:  # PostgreSQL may be away: one outage, logged as it starts and ends
                        delay = self.store_outage.failed(e)
                    else:
                        self.logger.error("%s; waiting to own %s again", e, self.name)
                    await self._leave("stopped", "running")
                    await wait_or_stop(stop, delay)
                except StoreUnavailable as e:  # let go: another instance may reach the store
                    delay = self.store_outage.failed(e)
                    await self._leave("retrying", "running")
                    await wait_or_stop(stop, delay)
                except WaitingForOperator as e:
                    if str(e) != told_operator:
                        self.logger.error("%s: %s; the other followers go on, and this one once it can", self.name,
                                          e)
                    told_operator = str(e)
                    await self._leave("failed", "failed")  # its recorded status and error stay as they are
                    await wait_or_stop(stop, WAITING_POLL_SECONDS)
        finally:
            await self._leave("stopped", "stopped")
            await self.on_stop()
            await self.wakeup.close()

    async def _own_until(self, stop: asyncio.Event) -> None:
        """Work (rounds in one task, supervision in this one) until ``stop``, a yield, or an error; then hand
        everything back."""
        await self.on_owner()
        log = getattr(self.recorder, "log", None)
        if log is not None:
            log.forget_gaps()  # proofs drawn from the server of a lost session prove nothing on another one
        rows = await asyncio.to_thread(self.lease.rows, self.lease.initial_slots())
        await self._took(rows, announce=True)
        halt = asyncio.Event()
        rounds = asyncio.get_running_loop().create_task(self._rounds(halt), name=f"{self.name} {self.owner}")
        yielded = False
        try:
            yielded = await self._supervise(stop, rounds)
        finally:
            halt.set()
            self.wakeup.poke()
            try:
                await rounds
            except (LeaseLost, StoreUnavailable):
                pass  # the supervision's own error (or the stop) ends this ownership already
            await self._leave("yielded" if yielded else "stopped", "stopped" if stop.is_set() else "running")
        if yielded:
            await wait_or_stop(stop, OPERATOR_POLL_SECONDS)

    async def _supervise(self, stop: asyncio.Event, rounds: asyncio.Task[None]) -> bool:
        """Every ``supervise_seconds`` (jittered): yield to a waiting rebuild, rebalance, resume what an operator
        decided, keep the group's row, report drain. True when it yielded."""
        while not stop.is_set():
            if rounds.done():
                rounds.result()  # its error, if it died of one
                return False
            if self.yields_to_waiters and await asyncio.to_thread(self.lease.has_waiters):
                self.logger.info("%s: yielding the lease to a rebuild", self.name)
                return True
            await asyncio.to_thread(self.lease.check_generation)  # GenerationChanged: join again under the new one
            await self.rebalance()
            await self._resume_decided()
            self._others = await asyncio.to_thread(self.lease.tick, list(self.slots))
            if self.on_caught_up is not None or self.on_poisoned is not None:
                if self._drain_head is None:
                    self._drain_head = await asyncio.to_thread(self.recorder.max_notification_id) or 0
                self._check_drained()
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({stopping, rounds}, timeout=self.supervise_seconds * random.uniform(0.5, 1.5),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
        return False

    # -- rounds --------------------------------------------------------------------------

    async def _rounds(self, halt: asyncio.Event) -> None:
        """Rounds until ``halt``: at once while there is more, else after a NOTIFY or the poll interval;
        after the back-off while ``retry_on`` errors or PostgreSQL fail."""
        wakeup = self.wakeup.view()
        while not halt.is_set():
            try:
                async with self._round:
                    if halt.is_set():
                        break
                    outcome = await self._one_round()
                    if self.store_outage.failures:
                        # A round that read nothing never used the fenced session: the outage is over only once
                        # that session stands too (LeaseLost otherwise, the same outage going on), not when the
                        # pool reaches a server again.
                        await self._prove_session()
                self.store_outage.recovered()
            except StoreUnavailable as e:
                self._proven = (False, 0)
                await wait_or_stop(halt, self.store_outage.failed(e))
                continue
            if outcome is True:
                continue
            if outcome is False:
                self._check_drained()
                await wakeup.wait(self.poll_interval)
            else:
                await wait_or_stop(halt, outcome)

    async def _one_round(self) -> bool | float:
        """Read, handle, save: True if there may be more right away, False if idle, or seconds to back off."""
        active = {s: slot.position for s, slot in self.slots.items() if slot.status != "failed"}
        if not active:
            return False
        page = await self.reader.read(active)
        if not page.events:
            moved = [s for s, through in page.through.items() if through > self.slots[s].position]
            for s in moved:
                self.slots[s].position = page.through[s]
            if moved:
                self.moved()
            if time.monotonic() - self._saved_at >= IDLE_SAVE_SECONDS:
                await self._save([(s, slot.position, None) for s, slot in self.slots.items()
                                  if slot.status != "failed" and (slot.position != slot.saved or slot.status != "running")])
            return bool(moved) and page.full
        await self._prove_session()
        if self.checks_generation_each_page:
            await asyncio.to_thread(self.lease.check_generation)  # GenerationChanged: join again under the new one
        began = time.monotonic()
        try:
            handled = await self.handle_page(page, active)
        except StoreUnavailable:
            raise  # PostgreSQL itself: the store outage's back-off in ``_rounds``, not the handler's ``retry_on``
        except (*self.retry_on, asyncio.CancelledError) as error:
            if isinstance(error, asyncio.CancelledError) and _cancelled_itself():
                raise
            # Else a library's own future cancelled under the handler (a client resetting its connections):
            # nothing was handled, and the page is tried again after the back-off like any retryable failure.
            first = min(events[0].id for events in page.events.values())
            delay = self.outage.failed(error, f" at position {first}", began)
            message = described(error)
            await asyncio.to_thread(self.lease.mark, "retrying", {
                s: {"message": message, "position": events[0].id} for s, events in page.events.items()})
            for s in page.events:
                self.slots[s].status = "retrying"
            await self.on_failure(error, self.outage.failures)
            return delay
        self.outage.recovered()
        outcome = {s: handled.get(s) or Handled(max(position, page.through.get(s, position)))
                   for s, position in active.items()}
        for s, h in outcome.items():
            if h.saved:
                slot = self.slots[s]
                slot.position = slot.saved = h.position
                slot.status = "running" if h.poison is None else "failed"
        await self._save([(s, h.position, h.poison) for s, h in outcome.items() if not h.saved and (
            h.poison is not None or h.position != self.slots[s].saved or self.slots[s].status != "running")])
        went_back: dict[str, list[str]] = {}  # one line per reason, naming every slot it stopped
        for s, h in outcome.items():
            self.slots[s].position = h.position
            if h.poison is not None:
                self._stopped.add(s)
                if is_went_back(h.poison):
                    went_back.setdefault(h.poison["message"], []).append(self.lease.names[s])
                else:
                    self.logger.critical("%s stopped at poison event %s: %s", self.lease.names[s],
                                         h.poison["position"], h.poison["message"])
        for message, names in went_back.items():
            self.logger.critical("%s stopped: %s", ", ".join(names), message)
        self.moved()
        return True

    async def _prove_session(self) -> None:
        """Before handling a page read after an outage or through a replaced connection: the fenced session must
        still stand (LeaseLost otherwise), or the page may come from another server than the one the slots were
        taken on (a promoted standby that lacks what the session's server had: the rows are taken again there,
        checked against it, and the publisher checks the broker)."""
        lost = getattr(self.recorder.datastore, "connections_lost", 0)
        if self._proven != (True, lost):
            await asyncio.to_thread(self.lease.check_generation)
            self._proven = (True, lost)

    # -- one slot, on a lease given (a rebuild's catch-up) -------------------------------

    async def catch_up(self, lease: Lease, position: int,
                       progress: Callable[[int, int], None] | None = None) -> int:
        """Handle batches until the log head is reached, saving on ``lease``; returns the position then."""
        while True:
            batch = await asyncio.to_thread(self.recorder.select_notifications, position + 1, self.batch_size)
            head = await asyncio.to_thread(self.recorder.max_notification_id) or 0
            if not batch:
                if head <= position:
                    return position
                await asyncio.sleep(GAP_POLL_SECONDS)  # a gap still being proven at the head
                continue
            handled = await self.handle(batch, position)
            if not handled.saved:
                await asyncio.to_thread(lease.save_position, handled.position, handled.poison)
            position = self.metrics.position = handled.position
            if progress is not None:
                progress(position, head)


def _cancelled_itself() -> bool:
    """Whether the running task is being cancelled (a stop), not merely meeting a future someone else cancelled."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0
