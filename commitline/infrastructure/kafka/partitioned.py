"""Publishing in parallel: any number of ``commitline publish`` instances share buckets of aggregates.

The log is divided into ``COMMITLINE_PUBLISH_BUCKETS`` buckets by aggregate id
(``followers/buckets.py``). A ``PartitionedPublisher`` is one instance: it joins the group
(``followers/group.py``: advisory locks on one connection), and every second or so (jittered, so
instances never move in step) it rebalances:

- it computes its fair share from the live members (``pg_locks``): ceil or floor of buckets / members;
- above its share, while another member is below its own, it hands over its surplus buckets (between
  two rounds of publishing, their positions saved) and releases their locks;
- below its share, it takes unowned buckets, in random order; a bucket unowned for more than
  ``UNOWNED_GRACE_SECONDS`` is taken by whoever sees it, share or not, so none stays unowned long
  when members disagree for a moment.

Publishing is one loop per instance, whatever the number of buckets it owns. Each round:

- reads the log ONCE for all its buckets that are not stopped (``BucketLog.read``: each bucket after its
  own position, no filter at all when it owns every bucket, stopping before an unproven gap); a bucket
  far behind the others (taken over from a slow instance, retried by an operator long after a poison
  record) is read in a second read of its own, so it does not hold the others back;
- builds the records, holds back each bucket's records from its first one the broker cannot take (a
  poison record stops that bucket only: its position stays before it, status ``failed``, until an
  operator's ``publisher retry`` or ``skip``), and sends all the others in one ``send_in_order``;
- saves every bucket's new position in one statement on the lock connection (a lost session cannot
  move them): the position moves past the events of other buckets too (a watermark), saved at most
  once a second while nothing of the bucket is published.

A broker failure fails the round: nothing moves, the buckets in it show ``retrying``, and the round is
read again after a back-off (logged once per outage). Rebalancing takes or hands over buckets only
between rounds (``_round``), so a bucket leaves an instance with every event it sent acknowledged and
saved: its next owner starts after that position, in order, without a gap.

Order: an aggregate is in exactly one bucket and a bucket has one owner at a time, so an aggregate's
events are sent by one instance at a time, in log order, and a new owner starts after the position
the last one saved (at-least-once after a crash). Records keep key = aggregate id and go to the
partition the Java client's default partitioner picks (murmur2 of the key modulo the topic's partition
count, ``producer.partition_for``), whoever sends them: one aggregate, one partition, as long as the
topic's partition count is not changed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, UnknownError
from eventsourcing.persistence import Notification

from commitline.application.errors import StoreUnavailable
from commitline.domain import EventRegistry
from commitline.infrastructure.config import Settings
from commitline.infrastructure.followers.group import GroupLease, GroupState
from commitline.infrastructure.followers.lease import LeaseLost, instance_id
from commitline.infrastructure.followers.outage import Outage
from commitline.infrastructure.followers.shared import SharedWakeup
from commitline.infrastructure.followers.wakeup import wait_or_stop
from commitline.infrastructure.kafka.envelope import KafkaRecord, to_record, topics_of
from commitline.infrastructure.kafka.producer import (
    RecordRefused,
    TopicSetupFailed,
    ensure_topics,
    holds_records,
    idempotence_refused,
    new_producer,
    record_size,
    send_in_order,
)
from commitline.infrastructure.kafka.publisher import PUBLISHER, PublisherMetrics
from commitline.infrastructure.kafka.publisher import log as publisher_log
from commitline.infrastructure.store.log import BucketLog, BucketPage
from commitline.infrastructure.store.recorder import EventRecorder

log = publisher_log  # one logger for the publisher, with or without buckets
REBALANCE_SECONDS = 1.0
UNOWNED_GRACE_SECONDS = 3.0
REJOIN_SECONDS = 2.0
IDLE_SAVE_SECONDS = 1.0  # positions moved past other buckets' events only are saved at most this often


class SharedProducer:
    """The Kafka producer of an instance (its publishing loop's; anything else of the instance may use it
    too, e.g. to start it early). One that failed is replaced, and closed once nobody sends with it."""

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
                except UnknownError as e:
                    await producer.stop()
                    if self.settings.kafka_idempotence:  # no retry will change the broker's answer
                        raise idempotence_refused(self.settings, e) from None
                    raise
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


@dataclass
class _Owned:
    """A bucket this instance owns."""

    position: int  # every event of the bucket at or below it is published (in memory)
    saved: int  # ... and this is what its row says
    status: str  # as its row says: running, retrying, or failed (stopped at a poison record)


@dataclass
class _Round:
    """One round's reads, and the records built from them: each bucket's events, its records up to its first
    record too large to send (then its poison: the position before it, the poison record), and how far each
    bucket's read is proven."""

    events: dict[int, list[Notification]]
    records: dict[int, list[KafkaRecord]]
    poisons: dict[int, tuple[int, dict[str, Any]]]
    through: dict[int, int]
    full: bool


class PartitionedPublisher:
    """One ``commitline publish`` instance: a member of the publisher group, publishing every bucket it owns
    in one loop. Offers what the CLI, ``run_until_signalled`` and ``/metrics`` use of a follower:
    ``run(stop)``, ``metrics``, ``waiting_for_operator``, ``on_caught_up``, ``on_poisoned``."""

    def __init__(self, recorder: EventRecorder, conninfo: dict[str, Any], settings: Settings,
                 registry: EventRegistry, *, owner: str | None = None,
                 on_published: Callable[[Sequence[KafkaRecord]], None] | None = None, broker_in_memory: bool = False,
                 tracing: Any = None):
        self.recorder = recorder
        self.registry = registry
        self.conninfo = conninfo
        self.settings = settings
        self.owner = owner or instance_id()
        self.on_published = on_published
        self.broker_in_memory = broker_in_memory
        self.tracing = tracing  # ``infrastructure/tracing.Tracing``: a publish span per record stored with a trace
        self.buckets = settings.publish_buckets
        self.batch_size = settings.publish_batch_size
        self.poll_interval = settings.publish_poll_interval_ms / 1000
        self.group = GroupLease(conninfo, recorder.datastore.schema, PUBLISHER, self.buckets, self.owner)
        self.lease = self.group  # its ``name`` labels this process's follower metrics
        self.log = BucketLog(recorder, self.buckets)
        self.wakeup = SharedWakeup(conninfo, recorder.channel_name)
        max_backoff = settings.publish_max_backoff_ms / 1000
        self.outage = Outage(log, "kafka", max_backoff)
        self.store_outage = Outage(log, f"{PUBLISHER}: PostgreSQL", max_backoff)
        self._join_outage = Outage(log, f"{PUBLISHER}: PostgreSQL", max_backoff)
        self.topics = topics_of(settings.kafka_topic_prefix, registry)
        self.producers = SharedProducer(settings, self.topics, f"commitline-{self.owner}")
        self.on_caught_up: Callable[[], None] | None = None
        self.on_poisoned: Callable[[], None] | None = None
        self.state: GroupState | None = None  # the group as the last rebalance saw it
        self._owned: dict[int, _Owned] = {}
        self._others: dict[int, tuple[int, str]] = {}  # bucket -> (position, status) saved, for buckets others own
        self._stopped: set[int] = set()  # buckets this instance stopped at a poison record (kept after it left)
        self._round: asyncio.Lock | None = None  # held by a round of publishing; buckets change hands between
        self._counts = PublisherMetrics()
        self._saved_at = 0.0
        self._drain_head: int | None = None
        self._drained = False
        self._unowned_since: dict[int, float] = {}
        self._used: AIOKafkaProducer | None = None
        self._prefetch: tuple[dict[int, int], asyncio.Task[_Round]] | None = None  # positions, their next page
        self._lag = 0

    # -- what the CLI, the metrics and the bench read --------------------------------

    @property
    def owned(self) -> list[int]:
        return sorted(self._owned)

    @property
    def positions(self) -> dict[int, int]:
        """The position of each bucket this instance owns (in memory: possibly ahead of its row)."""
        return {b: o.position for b, o in self._owned.items()}

    @property
    def waiting_for_operator(self) -> bool:
        return bool(self._stopped) or any(o.status == "failed" for o in self._owned.values())

    @property
    def metrics(self) -> PublisherMetrics:
        positions = {**{b: p for b, (p, _) in self._others.items()}, **self.positions}
        c = self._counts
        return PublisherMetrics(events_published=c.events_published, batches=c.batches, retries=c.retries,
                                position=min(positions.get(b, 0) for b in range(self.buckets)),
                                lag_events=self._lag, started_at=c.started_at)

    # -- the instance's loop ---------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Publish this instance's share of the buckets until ``stop`` is set; then finish the round in hand,
        leave the group and return."""
        # Allocating many short-lived objects per batch: what exists at start-up is moved out of the
        # collector's reach, so full collections stay short (as ``Follower.run`` does).
        gc.freeze()
        self._round = asyncio.Lock()
        await self._start_producer()  # a broker that cannot take this producer stops it now, not at its first event
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
                    await self._member_until(stop)
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

    async def _start_producer(self) -> None:
        try:
            async with self.producers.use():
                pass
        except (KafkaError, TopicSetupFailed, OSError, asyncio.TimeoutError):
            pass  # the broker is not there yet, or not quite: publishing rounds retry with back-off and report it

    async def _member_until(self, stop: asyncio.Event) -> None:
        """Publish (one task) and rebalance (this one) until ``stop``, or until either fails."""
        halt = asyncio.Event()
        publishing = asyncio.get_running_loop().create_task(self._publish(halt), name=f"{PUBLISHER} {self.owner}")
        try:
            await self._rebalance_until(stop, publishing)
        finally:
            halt.set()
            self.wakeup.poke()
            try:
                await publishing
            except (LeaseLost, StoreUnavailable):
                pass  # the rebalancing's own error (or the stop) ends this membership already

    async def _rebalance_until(self, stop: asyncio.Event, publishing: asyncio.Task[None]) -> None:
        while not stop.is_set():
            if publishing.done():
                publishing.result()  # its error, if it died of one
                return
            state = await asyncio.to_thread(self.group.state)
            self.state = state
            await self._rebalance(state)
            await self._resume_decided()
            if 0 in self._owned:  # the owner of bucket 0 keeps the group's row
                await asyncio.to_thread(self.group.summarise, "running")
            if len(self._owned) < self.buckets:
                saved = await asyncio.to_thread(self.group.run, self.group.saved_rows)
                self._others = {b: row for b, row in saved.items() if b not in self._owned}
            if self.on_caught_up is not None or self.on_poisoned is not None:
                if self._drain_head is None:
                    self._drain_head = await asyncio.to_thread(self.recorder.max_notification_id) or 0
                self._check_drained()
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({stopping, publishing}, timeout=REBALANCE_SECONDS * random.uniform(0.5, 1.5),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()

    async def _rebalance(self, state: GroupState) -> None:
        now = time.monotonic()
        share = state.share(self.buckets)
        mine = sorted(self._owned)
        unowned = [b for b in range(self.buckets) if b not in state.owners]
        self._unowned_since = {b: self._unowned_since.get(b, now) for b in unowned}
        counts = {m: len(state.owned_by(m)) for m in state.members}
        someone_short = any(counts[m] < state.share(self.buckets, m) for m in state.members)
        if len(mine) > share and someone_short:
            surplus = mine[share:]  # the lowest stay: the owner of bucket 0 keeps the group's row
            log.info("%s: %s hands over buckets %s (%d members, share %d)", PUBLISHER, self.owner, surplus,
                     len(state.members), share)
            assert self._round is not None
            async with self._round:  # between two rounds: every event sent of these buckets is saved
                for bucket in surplus:
                    await self._hand_back(bucket)
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
                taken.append(bucket)
        if taken:
            rows = await asyncio.to_thread(self.group.rows, taken)
            assert self._round is not None
            async with self._round:
                for bucket, (position, status) in rows.items():
                    self._owned[bucket] = _Owned(position, position, status)
                    self._others.pop(bucket, None)
            self.wakeup.poke()
            log.info("%s: %s took buckets %s (%d members, share %d)", PUBLISHER, self.owner, sorted(taken),
                     len(state.members), share)

    async def _hand_back(self, bucket: int) -> None:
        """Give up an owned bucket, saving a move not saved yet (round lock held)."""
        owned = self._owned.pop(bucket)
        self._others[bucket] = (owned.position, owned.status)
        await asyncio.to_thread(self.group.hand_back, bucket,
                                owned.position if owned.position != owned.saved else None)

    async def _resume_decided(self) -> None:
        """Buckets stopped at a poison record go on once an operator decided (``publisher retry``/``skip``)."""
        stopped = [b for b, o in self._owned.items() if o.status == "failed"]
        if not stopped:
            return
        rows = await asyncio.to_thread(self.group.rows, stopped)
        assert self._round is not None
        async with self._round:
            for bucket, (position, status) in rows.items():
                owned = self._owned.get(bucket)
                if owned is not None and status != "failed":
                    log.info("%s: bucket %d goes on from position %d (an operator decided)", PUBLISHER, bucket,
                             position)
                    self._owned[bucket] = _Owned(position, position, status)
                    self._stopped.discard(bucket)
        self.wakeup.poke()

    async def _leave(self, stop: asyncio.Event) -> None:
        """Hand back every bucket (saving moves not saved yet), write the group's row if this instance kept it,
        and leave the group."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            prefetch[1].cancel()
            prefetch[1].add_done_callback(lambda t: t.cancelled() or t.exception())
        if self._round is not None and self._owned:
            async with self._round:
                leader = 0 in self._owned
                for bucket in sorted(self._owned):
                    await self._hand_back(bucket)
                if leader:
                    try:
                        await asyncio.to_thread(self.group.summarise, "stopped" if stop.is_set() else "running")
                    except (LeaseLost, StoreUnavailable):
                        pass
        await asyncio.to_thread(self.group.leave)

    # -- publishing ------------------------------------------------------------------

    async def _publish(self, halt: asyncio.Event) -> None:
        """Rounds of publishing until ``halt``: at once while there is more, else after a NOTIFY or the poll
        interval; after the back-off while the broker or PostgreSQL fails."""
        wakeup = self.wakeup.view()
        assert self._round is not None
        while not halt.is_set():
            try:
                async with self._round:
                    if halt.is_set():
                        break
                    outcome = await self._publish_round()
                self.store_outage.recovered()
            except StoreUnavailable as e:
                await wait_or_stop(halt, self.store_outage.failed(e))
                continue
            if outcome is True:
                continue
            if outcome is False:
                self._check_drained()
                await wakeup.wait(self.poll_interval)
            else:
                await wait_or_stop(halt, outcome)

    async def _publish_round(self) -> bool | float:
        """One round: True if there may be more right away, False if idle, or seconds to back off."""
        active = {b: o.position for b, o in self._owned.items() if o.status != "failed"}
        if not active:
            return False
        read = await self._read(active)
        if read.full:  # likely more: read the next page while this one is sent (used if every bucket succeeds)
            following = {b: max(p, read.through[b]) for b, p in active.items()}
            self._prefetch = (following, asyncio.get_running_loop().create_task(self._read_pages(following)))
        if not read.events:
            moved = [b for b, through in read.through.items() if through > self._owned[b].position]
            for b in moved:
                self._owned[b].position = read.through[b]
            if time.monotonic() - self._saved_at >= IDLE_SAVE_SECONDS:
                await self._save()  # the moves held back, once due
            return bool(moved) and read.full
        self._used = None
        spans = self.tracing.publish_spans(read.records) if self.tracing is not None else None
        try:
            async with self.producers.use() as producer:
                self._used = producer
                acked = await self._send(producer, read, active)
        except KafkaError as error:
            if spans:
                self.tracing.end_publish(spans.values(), error)
            first = min(events[0].id for events in read.events.values())
            delay = self.outage.failed(error, f" at position {first}")
            self._counts.retries += 1
            message = f"{type(error).__name__}: {error}"
            await asyncio.to_thread(self.group.mark, "retrying", {
                b: {"message": message, "position": events[0].id} for b, events in read.events.items()})
            for b in read.events:
                self._owned[b].status = "retrying"
            await self.producers.discard(self._used)
            return delay
        self.outage.recovered()
        if spans:
            self.tracing.end_publish(spans.values(), sent={r.notification_id for r in acked})
        poisons = read.poisons
        self._counts.events_published += len(acked)  # acknowledged (counted before the positions show them)
        self._counts.batches += 1
        moves = {b: max(self._owned[b].position, through) for b, through in read.through.items() if b not in poisons}
        await self._save([*[(b, p, None) for b, p in moves.items()
                            if p != self._owned[b].saved or self._owned[b].status != "running"],
                          *[(b, position, poison) for b, (position, poison) in poisons.items()]])
        for b, position in moves.items():
            self._owned[b].position = position
        for b in poisons:
            self._stopped.add(b)
            log.critical("%s stopped at poison event %s: %s", self.group.names[b], poisons[b][1]["position"],
                         poisons[b][1]["message"])
        if self.on_published is not None:
            self.on_published(acked)
        return True

    async def _read(self, active: dict[int, int]) -> _Round:
        """The page read ahead during the last round if it was read from these very positions, else a new one."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            positions, task = prefetch
            if positions == active:
                return await task
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody waits for it
        return await self._read_pages(active)

    async def _read_pages(self, active: dict[int, int]) -> _Round:
        return await asyncio.to_thread(self._read_and_build, active)

    def _read_and_build(self, active: dict[int, int]) -> _Round:
        """One read for all the active buckets (a second one, of their own, for buckets far behind the others:
        a read starting at them would hold back everybody else until they caught up), and the records of what
        was read. In a worker thread: the page after this one is read and built while this one is sent."""
        ahead = max(active.values()) - self.batch_size
        cohorts = [{b: p for b, p in active.items() if p >= ahead}, {b: p for b, p in active.items() if p < ahead}]
        events: dict[int, list[Notification]] = {}
        through: dict[int, int] = {}
        full = False
        for cohort in cohorts:
            if not cohort:
                continue
            page: BucketPage = self.log.read(cohort, self.batch_size)
            full = full or page.full
            for b, position in cohort.items():
                through[b] = max(position, page.through)
            for n, b in zip(page.notifications, page.buckets):
                events.setdefault(b, []).append(n)
        prefix, owner, limit = self.settings.kafka_topic_prefix, self.owner, self.settings.kafka_max_message_bytes
        records = {b: [to_record(n, prefix, owner, self.registry) for n in batch] for b, batch in events.items()}
        built = _Round(events, records, {}, through, full)
        for bucket, batch in records.items():
            for i, record in enumerate(batch):
                if (size := record_size(record)) > limit:
                    self._stop_at(built, bucket, i, active[bucket], (
                        f"record of {size} bytes is larger than the broker's limit of {limit} bytes "
                        "(COMMITLINE_KAFKA_MAX_MESSAGE_BYTES)"))
                    break
        return built

    @staticmethod
    def _stop_at(built: _Round, bucket: int, index: int, position: int, reason: str) -> None:
        """The bucket stops before its ``index``-th event of the round: its records from there on are dropped."""
        batch = built.events[bucket]
        stopped = batch[index]
        built.poisons[bucket] = (batch[index - 1].id if index else position, {
            "position": stopped.id, "event_type": stopped.topic, "aggregate_id": str(stopped.originator_id),
            "version": stopped.originator_version, "message": reason})
        built.records[bucket] = built.records[bucket][:index]

    async def _send(self, producer: AIOKafkaProducer, built: _Round, positions: dict[int, int]) -> list[KafkaRecord]:
        """Send every bucket's records (up to its first poison record) in one ``send_in_order``; a record batch
        the broker refuses as too large stops the bucket of its first record there. The records acknowledged."""
        bucket_of_record = {r.notification_id: b for b, batch in built.records.items() for r in batch}
        while True:
            flat = [r for batch in built.records.values() for r in batch]
            try:
                await send_in_order(producer, flat)
                return flat
            except RecordRefused as refused:
                bucket = bucket_of_record[refused.record.notification_id]
                self._stop_at(built, bucket, built.records[bucket].index(refused.record), positions[bucket],
                              f"the broker refused the record batch starting here as too large ({refused}); "
                              "set COMMITLINE_KAFKA_MAX_MESSAGE_BYTES to the broker's message.max.bytes")

    async def _save(self, rows: list[tuple[int, int, dict[str, Any] | None]] | None = None) -> None:
        """Save ``rows`` (bucket, position, poison record or None) in one statement; by default every active
        bucket whose row is behind its position or still says ``retrying``."""
        if rows is None:
            rows = [(b, o.position, None) for b, o in self._owned.items()
                    if o.status != "failed" and (o.position != o.saved or o.status != "running")]
        if rows:
            await asyncio.to_thread(self.group.save, rows)
        for b, position, poison in rows:
            owned = self._owned[b]
            owned.position = owned.saved = position
            owned.status = "running" if poison is None else "failed"
        self._saved_at = time.monotonic()

    # -- drain, the embedded broker, metrics -----------------------------------------

    def _check_drained(self) -> None:
        """``--drain``: done once every bucket reached the head it had when draining began, or stopped at a
        poison record (then ``on_poisoned``, else ``on_caught_up``)."""
        head = self._drain_head
        if head is None or self._drained:
            return
        poisoned = False
        for b in range(self.buckets):
            owned = self._owned.get(b)
            position, status = (owned.position, owned.status) if owned else self._others.get(b, (0, "never run"))
            if status == "failed":
                poisoned = True
            elif position < head:
                return
        self._drained = True
        if poisoned:
            self._stopped.update(b for b in range(self.buckets)
                                 if (self._owned[b].status if b in self._owned else self._others.get(b, (0, ""))[1])
                                 == "failed")
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
