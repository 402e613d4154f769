"""Publishing in parallel: any number of ``commitline publish`` instances share buckets of aggregates.

The log is divided into ``COMMITLINE_PUBLISH_BUCKETS`` buckets by aggregate id
(``followers/buckets.py``). A ``PartitionedPublisher`` is one instance: it joins the group
(``followers/group.py``: advisory locks on one connection), and every second or so (jittered, so
instances never move in step) it rebalances:

- it computes its fair share from the live members (``pg_locks``): ceil or floor of buckets / members;
- above its share, while another member is below its own, it stops the workers of its surplus
  buckets (each finishes its batch in hand and saves its position) and releases their locks;
- below its share, it takes unowned buckets, in random order; a bucket unowned for more than
  ``UNOWNED_GRACE_SECONDS`` is taken by whoever sees it, share or not, so none stays unowned long
  when members disagree for a moment.

Each owned bucket runs a ``BucketPublisher``: the one follower engine (``followers/engine.py``) with
the ``KafkaPublisher``'s batch handling, reading the gap-safe log of its bucket only, saving its own
position on the instance's lock connection, stopping at a poison record on its own (the other
buckets go on). The workers of an instance share one Kafka producer, one LISTEN connection and the
outage log lines.

Order: an aggregate is in exactly one bucket and a bucket has one owner at a time, so an aggregate's
events are sent by one instance at a time, in log order, and a new owner starts after the position
the last one saved (at-least-once). Records keep key = aggregate id and go to the partition the Java
client's default partitioner picks (murmur2 of the key modulo the topic's partition count,
``producer.partition_for``), whoever sends them: one aggregate, one partition, as long as the
topic's partition count is not changed.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from eventsourcing.persistence import Notification

from commitline.application.errors import StoreUnavailable
from commitline.domain import AGGREGATES
from commitline.infrastructure.config import Settings
from commitline.infrastructure.followers.buckets import BucketLog
from commitline.infrastructure.followers.engine import Follower, Handled
from commitline.infrastructure.followers.group import BucketLease, GroupLease, GroupState
from commitline.infrastructure.followers.lease import Lease, LeaseLost, instance_id
from commitline.infrastructure.followers.outage import Outage
from commitline.infrastructure.followers.shared import SharedOutage, SharedWakeup
from commitline.infrastructure.followers.wakeup import wait_or_stop
from commitline.infrastructure.kafka.envelope import KafkaRecord, topic_for
from commitline.infrastructure.kafka.producer import ensure_topics, holds_records, new_producer
from commitline.infrastructure.kafka.publisher import PUBLISHER, KafkaPublisher, PublisherMetrics
from commitline.infrastructure.kafka.publisher import log as publisher_log
from commitline.infrastructure.store.recorder import EventRecorder

log = publisher_log  # one logger for the publisher, with or without buckets
REBALANCE_SECONDS = 1.0
UNOWNED_GRACE_SECONDS = 3.0
REJOIN_SECONDS = 2.0


class SharedProducer:
    """One Kafka producer for every bucket worker of an instance. One that failed is replaced, and closed
    once no worker is sending with it any more."""

    def __init__(self, settings: Settings, topics: Sequence[str], client_id: str):
        self.settings = settings
        self.topics = list(topics)
        self.client_id = client_id
        self._current: AIOKafkaProducer | None = None
        self._users: dict[AIOKafkaProducer, int] = {}
        self._retired: set[AIOKafkaProducer] = set()
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def use(self) -> AsyncIterator[AIOKafkaProducer]:
        async with self._lock:
            if self._current is None:
                await ensure_topics(self.settings, self.topics)
                producer = new_producer(self.settings, self.client_id)
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()
                    raise
                self._current = producer
            producer = self._current
        self._users[producer] = self._users.get(producer, 0) + 1
        try:
            yield producer
        finally:
            self._users[producer] -= 1
            if producer in self._retired and not self._users[producer]:
                await self._close(producer)

    async def discard(self, producer: AIOKafkaProducer | None) -> None:
        if producer is None:
            return
        if producer is self._current:
            self._current = None
            self._retired.add(producer)
        if producer in self._retired and not self._users.get(producer):
            await self._close(producer)

    async def close(self) -> None:
        for producer in [*self._retired, *([self._current] if self._current else [])]:
            await self._close(producer)
        self._current = None

    async def _close(self, producer: AIOKafkaProducer) -> None:
        self._retired.discard(producer)
        self._users.pop(producer, None)
        try:
            await asyncio.wait_for(producer.stop(), timeout=15)
        except (KafkaError, asyncio.TimeoutError, OSError):
            pass


class BucketPublisher(KafkaPublisher):
    """The publisher of one bucket, run by a ``PartitionedPublisher`` while it owns the bucket."""

    def __init__(self, instance: PartitionedPublisher, bucket: int):
        super().__init__(instance.recorder, instance.conninfo, instance.settings, owner=instance.owner,
                         on_published=instance.on_published)
        self.instance = instance
        self.bucket = bucket
        # The instance's shared parts instead of a lease, a LISTEN connection and outage logs of its own.
        self.lease = BucketLease(instance.group, bucket)  # type: ignore[assignment]
        self.wakeup = instance.wakeup.view()  # type: ignore[assignment]
        self.outage = instance.outage.member(self.lease.name)  # type: ignore[assignment]
        self.store_outage = instance.store_outage.member(self.lease.name)  # type: ignore[assignment]
        self._used: AIOKafkaProducer | None = None

    async def run(self, stop: asyncio.Event) -> None:
        await Follower.run(self, stop)  # the instance reports the metrics

    async def on_owner(self) -> None:
        """The instance checks an in-memory broker once for all buckets."""

    async def on_stop(self) -> None:
        """The producer is the instance's."""

    async def on_failure(self, error: BaseException, attempt: int) -> None:
        self.metrics.retries += 1
        await self.instance.producers.discard(self._used)

    @asynccontextmanager
    async def _batch_producer(self) -> AsyncIterator[AIOKafkaProducer]:
        async with self.instance.producers.use() as producer:
            self._used = producer
            yield producer

    async def step(self, lease: Lease, position: int, stop: asyncio.Event | None = None) -> Handled | None:
        """The engine's step over the bucket's log: a read with none of the bucket's events still moves the
        position past the events of other buckets (saved at most once a second)."""
        page = await asyncio.to_thread(self.instance.log.read, self.bucket, position + 1, self.batch_size)
        batch: list[Notification] = page.notifications
        if not batch:
            if page.through <= position:
                if self.lease.pending is not None:  # idle: save a move that was held back, once it is due
                    await asyncio.to_thread(self.lease.advance, self.lease.pending)
                return None
            await asyncio.to_thread(self.lease.advance, page.through)
            self.metrics.position = page.through
            return Handled(page.through, saved=True)
        handled = await self._handle_retrying(batch, position, lease, stop or asyncio.Event())
        if handled is None:  # asked to stop during an outage
            return Handled(position, saved=True)
        if handled.poison is None:
            handled = Handled(max(handled.position, page.through))
        await asyncio.to_thread(lease.save_position, handled.position, handled.poison)
        self.metrics.position = handled.position
        await self.on_saved(batch, handled)
        return handled


@dataclass
class _Worker:
    publisher: BucketPublisher
    stop: asyncio.Event
    task: asyncio.Task[None]


class PartitionedPublisher:
    """One ``commitline publish`` instance: a member of the publisher group, running a ``BucketPublisher``
    for each bucket it owns. Offers what the CLI, ``run_until_signalled`` and ``/metrics`` use of a
    follower: ``run(stop)``, ``metrics``, ``waiting_for_operator``, ``on_caught_up``, ``on_poisoned``."""

    def __init__(self, recorder: EventRecorder, conninfo: dict[str, Any], settings: Settings, *,
                 owner: str | None = None, on_published: Callable[[Sequence[KafkaRecord]], None] | None = None,
                 broker_in_memory: bool = False):
        self.recorder = recorder
        self.conninfo = conninfo
        self.settings = settings
        self.owner = owner or instance_id()
        self.on_published = on_published
        self.broker_in_memory = broker_in_memory
        self.buckets = settings.publish_buckets
        self.group = GroupLease(conninfo, recorder.datastore.schema, PUBLISHER, self.buckets, self.owner)
        self.lease = self.group  # its ``name`` labels this process's follower metrics
        self.log = BucketLog(recorder, self.buckets)
        self.wakeup = SharedWakeup(conninfo, recorder.channel_name)
        max_backoff = settings.publish_max_backoff_ms / 1000
        self.outage = SharedOutage(log, "kafka", max_backoff)
        self.store_outage = SharedOutage(log, f"{PUBLISHER}: PostgreSQL", max_backoff)
        self._join_outage = Outage(log, f"{PUBLISHER}: PostgreSQL", max_backoff)
        self.topics = [topic_for(settings.kafka_topic_prefix, a.__name__) for a in AGGREGATES]
        self.producers = SharedProducer(settings, self.topics, f"commitline-{self.owner}")
        self.on_caught_up: Callable[[], None] | None = None
        self.on_poisoned: Callable[[], None] | None = None
        self.state: GroupState | None = None  # the group as the last rebalance saw it
        self._workers: dict[int, _Worker] = {}
        self._finished = PublisherMetrics()  # the counts of workers that stopped
        self._positions: dict[int, int] = {}  # bucket -> saved position, for buckets others own
        self._done: dict[int, bool] = {}  # bucket -> stopped at a poison record, once caught up or stopped
        self._unowned_since: dict[int, float] = {}
        self._lag = 0

    # -- what the CLI and the metrics read -------------------------------------------

    @property
    def owned(self) -> list[int]:
        return sorted(self._workers)

    @property
    def waiting_for_operator(self) -> bool:
        return any(w.publisher.waiting_for_operator for w in self._workers.values()) or any(self._done.values())

    @property
    def metrics(self) -> PublisherMetrics:
        live = [w.publisher.metrics for w in self._workers.values()]
        positions = {**self._positions, **{b: w.publisher.metrics.position for b, w in self._workers.items()}}
        f = self._finished
        return PublisherMetrics(
            events_published=f.events_published + sum(m.events_published for m in live),
            batches=f.batches + sum(m.batches for m in live), retries=f.retries + sum(m.retries for m in live),
            position=min(positions.get(b, 0) for b in range(self.buckets)), lag_events=self._lag,
            started_at=f.started_at)

    # -- the instance's loop ---------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Publish this instance's share of the buckets until ``stop`` is set; then let every worker finish
        its batch in hand, leave the group and return."""
        reporter = asyncio.create_task(self._report_metrics(stop))
        waiting_because = None
        try:
            while not stop.is_set():
                try:
                    because = await asyncio.to_thread(self.group.join)
                    self._join_outage.recovered()
                    if because is not None:
                        if because != waiting_because:
                            log.error("%s: %s; waiting", PUBLISHER, because)
                        waiting_because = because
                        await wait_or_stop(stop, REJOIN_SECONDS)
                        continue
                    waiting_because = None
                    if self.broker_in_memory:
                        await self._republish_if_broker_is_new()
                        self.broker_in_memory = False
                    await self._rebalance_until(stop)
                except LeaseLost as e:
                    log.error("%s; joining again", e)
                except StoreUnavailable as e:
                    delay = self._join_outage.failed(e)
                    await self._leave(stop)
                    await wait_or_stop(stop, delay)
                finally:
                    await self._leave(stop)
        finally:
            reporter.cancel()
            await self._leave(stop)
            await self.wakeup.close()
            await self.producers.close()

    async def _rebalance_until(self, stop: asyncio.Event) -> None:
        drain_head = None
        while not stop.is_set():
            self._raise_if_a_worker_failed()
            state = await asyncio.to_thread(self.group.state)
            self.state = state
            await self._rebalance(state)
            if 0 in self._workers:  # the owner of bucket 0 keeps the group's row
                await asyncio.to_thread(self.group.summarise, "running")
            if len(self._workers) < self.buckets:
                self._positions = await asyncio.to_thread(self.group.run, self.group.saved_positions)
            if self.on_caught_up is not None:
                if drain_head is None:
                    drain_head = await asyncio.to_thread(self.recorder.max_notification_id) or 0
                self._check_drained(drain_head)
            await wait_or_stop(stop, REBALANCE_SECONDS * random.uniform(0.5, 1.5))

    async def _rebalance(self, state: GroupState) -> None:
        now = time.monotonic()
        share = state.share(self.buckets)
        mine = sorted(self._workers)
        unowned = [b for b in range(self.buckets) if b not in state.owners]
        self._unowned_since = {b: self._unowned_since.get(b, now) for b in unowned}
        counts = {m: len(state.owned_by(m)) for m in state.members}
        someone_short = any(counts[m] < state.share(self.buckets, m) for m in state.members)
        if len(mine) > share and someone_short:
            surplus = mine[share:]  # the lowest stay: the owner of bucket 0 keeps the group's row
            log.info("%s: %s hands over buckets %s (%d members, share %d)", PUBLISHER, self.owner, surplus,
                     len(state.members), share)
            for bucket in surplus:
                await self._stop_worker(bucket)
                await asyncio.to_thread(self.group.give_up, bucket)
            return
        wanted = share - len(mine)
        if wanted > 0:
            candidates = random.sample(unowned, len(unowned))
        else:  # at its share: only a bucket left unowned too long, one per round
            candidates = [b for b in unowned if now - self._unowned_since[b] >= UNOWNED_GRACE_SECONDS][:1]
            wanted = len(candidates)
        taken = []
        for bucket in candidates:
            if len(taken) >= wanted:
                break
            if await asyncio.to_thread(self.group.take, bucket):
                self._start_worker(bucket)
                taken.append(bucket)
        if taken:
            log.info("%s: %s took buckets %s (%d members, share %d)", PUBLISHER, self.owner, sorted(taken),
                     len(state.members), share)

    def _start_worker(self, bucket: int) -> None:
        publisher = BucketPublisher(self, bucket)
        if self.on_caught_up is not None or self.on_poisoned is not None:
            publisher.on_caught_up = lambda: self._report_done(bucket, False)
            publisher.on_poisoned = lambda: self._report_done(bucket, True)
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(publisher.run(stop), name=f"{PUBLISHER} bucket {bucket}")
        self._workers[bucket] = _Worker(publisher, stop, task)

    async def _stop_worker(self, bucket: int) -> BaseException | None:
        """Stop a bucket's worker (it finishes its batch and saves); the error it died of, if it did."""
        worker = self._workers.pop(bucket)
        worker.stop.set()
        self.wakeup.poke()
        error = None
        try:
            await worker.task
        except Exception as e:
            error = e
        m, f = worker.publisher.metrics, self._finished
        f.events_published, f.batches, f.retries = (f.events_published + m.events_published, f.batches + m.batches,
                                                    f.retries + m.retries)
        self._positions[bucket] = m.position
        return error

    async def _leave(self, stop: asyncio.Event) -> None:
        """Stop every worker, write the group's row if this instance kept it, and leave the group."""
        leader = 0 in self._workers
        errors = [e for e in [await self._stop_worker(b) for b in sorted(self._workers)] if e is not None]
        if leader:
            try:
                await asyncio.to_thread(self.group.summarise, "stopped" if stop.is_set() else "running")
            except (LeaseLost, StoreUnavailable):
                pass
        await asyncio.to_thread(self.group.leave)
        if errors:
            raise errors[0]

    def _raise_if_a_worker_failed(self) -> None:
        for worker in self._workers.values():
            if worker.task.done() and not worker.task.cancelled() and worker.task.exception() is not None:
                raise worker.task.exception()  # type: ignore[misc]

    def _report_done(self, bucket: int, poisoned: bool) -> None:
        self._done[bucket] = poisoned

    def _check_drained(self, head: int) -> None:
        """``--drain``: done once every bucket reached ``head`` (the head when draining began) or stopped at a
        poison record; this instance's own buckets count once their worker reported so."""
        done = set(self._done)
        if not done.issuperset(self._workers):
            return
        others = [b for b in range(self.buckets) if b not in self._workers]
        if any(b not in done and self._positions.get(b, 0) < head for b in others):
            return
        if any(self._done.values()):
            if self.on_poisoned is not None:
                self.on_poisoned()
        elif self.on_caught_up is not None:
            self.on_caught_up()

    async def _republish_if_broker_is_new(self) -> None:
        # A broker that keeps records in memory only (the embedded one) may be newer than the saved
        # positions: then everything goes to it again, so it never lacks what a position claims it has.
        highest = await asyncio.to_thread(self.group.run, self.group.highest_position)
        if highest > 0:
            await ensure_topics(self.settings, self.topics)
            if not await holds_records(self.settings, self.topics):
                log.warning("the embedded broker is new (it keeps records in memory only): publishing again from "
                            "the first event, not from position %d", highest)
                await asyncio.to_thread(self.group.run, self.group.reset_positions)

    async def _report_metrics(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_or_stop(stop, self.settings.metrics_interval_s)
            try:
                head = await asyncio.to_thread(self.recorder.max_notification_id)
            except StoreUnavailable:
                continue
            metrics = self.metrics
            self._lag = max(0, (head or 0) - metrics.position)
            log.info("publisher metrics %s", json.dumps({"owner": self.owner, "buckets": self.owned,
                                                         **asdict(metrics), "lag_events": self._lag}))
