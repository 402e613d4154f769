"""The Kafka publisher: a follower (``followers/engine.py``) over buckets of aggregates, any number of
``commitline publish`` instances sharing them.

The log is divided into ``COMMITLINE_PUBLISH_BUCKETS`` buckets by aggregate id (``store/log.py``); each
instance is a member of the publisher group (``followers/group.py``) owning its fair share of them, a
position each. The engine joins, reads every owned bucket in one read, saves the positions, waits, backs
off and drains; what this module adds is the publisher's own part:

- **its batch handling** (``prepare``, ``handle_page``): the records of a page are built in the reading
  thread (the next page is read and built while this one is sent: ``read_ahead``); a bucket's records are
  held back from its first one the broker cannot take (larger than ``COMMITLINE_KAFKA_MAX_MESSAGE_BYTES``,
  or refused by the broker as too large): a poison record stops that bucket only, at the position before
  it, status ``failed``, until an operator's ``publisher retry`` (after raising the limit) or
  ``publisher skip --position N``; all the other records are sent in one ``send_in_order``, and a
  bucket's position moves only after the broker acknowledged everything up to it (acks=all);
- **its failure policy**: a broker failure (``KafkaError``) fails the round: nothing moves, the buckets in
  it show ``retrying``, the producer is replaced, and the round is read again after a back-off (logged
  once per outage). Commands keep working: the command path never talks to Kafka;
- **its check of the broker** (``broker_check.py``): before it sends anything for buckets it took (or that
  an operator let go on), it reads the last record of every partition: a record of the store's generation that
  the store does not hold, or one of a newer generation, means the store went back (a restore, an
  asynchronous failover), and the buckets stop with a ``store_went_back`` error instead of publishing other
  events under notification ids already used. Every envelope carries the generation the instance joined under;
- **its rebalance hook**: every second or so (jittered, so instances never move in step) it computes its
  fair share from the live members (``group.plan_rebalance``) and hands over its surplus or takes
  unowned buckets, always between two rounds, so a bucket leaves an instance with every event it sent
  acknowledged and saved: its next owner starts after that position, in order, without a gap.

Order: an aggregate is in exactly one bucket and a bucket has one owner at a time, so an aggregate's
events are sent by one instance at a time, in log order, and a new owner starts after the position the
last one saved (at-least-once after a crash; each record carries its event id for consumer
deduplication). Records keep key = aggregate id and go to the partition the Java client's default
partitioner picks (murmur2 of the key modulo the topic's partition count, ``producer.partition_for``),
whoever sends them: one aggregate, one partition, as long as the topic's partition count is not changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from eventsourcing.persistence import Notification

from commitline.application.errors import StoreUnavailable
from commitline.domain import EventRegistry
from commitline.infrastructure.config import Settings
from commitline.infrastructure.followers.engine import Follower, Handled, Page
from commitline.infrastructure.followers.group import GroupLease, GroupState, plan_rebalance
from commitline.infrastructure.followers.outage import described
from commitline.infrastructure.followers.wakeup import wait_or_stop
from commitline.infrastructure.followers.went_back import went_back
from commitline.infrastructure.kafka.broker_check import evidence, last_records
from commitline.infrastructure.kafka.envelope import KafkaRecord, RecordBuilder, topics_of
from commitline.infrastructure.kafka.producer import (
    RecordRefused,
    TopicSetupFailed,
    ensure_topics,
    holds_records,
    record_size,
    send_in_order,
)
from commitline.infrastructure.kafka.shared_producer import SharedProducer
from commitline.infrastructure.store.generations import current_and_head, event_ids_at
from commitline.infrastructure.store.recorder import EventRecorder

log = logging.getLogger(__name__)
#: Room a record needs beside its stored event: the envelope's ids, names, tenant and times, and the headers.
ENVELOPE_ALLOWANCE = 16_384
PUBLISHER = "kafka-publisher"
REBALANCE_SECONDS = 1.0
#: Bytes a record holds besides its value and its event type's name, the batch framing included, at most (the
#: publisher's name aside): key (36), the event_id, event_type, publisher and generation headers' names and
#: values, their length prefixes, the record's and the batch's headers (61) come to about 270.
SIZE_MARGIN = 1024
# aiokafka logs every failed connection attempt; the publisher reports an outage once itself.
logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


@dataclass
class PublisherMetrics:
    events_published: int = 0
    batches: int = 0
    retries: int = 0
    position: int = 0
    lag_events: int = 0
    started_at: float = field(default_factory=time.time)


@dataclass
class Records:
    """A page's records, per bucket up to its first record too large to send (then its poison: the position
    before it, and the poison record)."""

    records: dict[int, list[KafkaRecord]]
    poisons: dict[int, tuple[int, dict[str, Any]]]

    def stop_at(self, events: list[Notification], bucket: int, index: int, position: int, reason: str) -> None:
        """The bucket stops before its ``index``-th event of the page: its records from there on are dropped."""
        stopped = events[index]
        self.poisons[bucket] = (events[index - 1].id if index else position, {
            "position": stopped.id, "event_type": stopped.topic, "aggregate_id": str(stopped.originator_id),
            "version": stopped.originator_version, "message": reason})
        self.records[bucket] = self.records[bucket][:index]


class Publisher(Follower):
    """One ``commitline publish`` instance: a member of the publisher group, publishing every bucket it owns."""

    retry_on = (KafkaError,)
    checks_generation_each_page = True  # every record carries the generation: never the old one after a new began
    outage_subject = "kafka"
    read_ahead = True
    supervise_seconds = REBALANCE_SECONDS

    def __init__(self, recorder: EventRecorder, conninfo: dict[str, Any], settings: Settings,
                 registry: EventRegistry, *, owner: str | None = None,
                 on_published: Callable[[Sequence[KafkaRecord]], None] | None = None, broker_in_memory: bool = False,
                 tracing: Any = None):
        super().__init__(recorder, conninfo, PUBLISHER, batch_size=settings.publish_batch_size,
                         poll_interval=settings.publish_poll_interval_ms / 1000, owner=owner,
                         max_backoff=settings.publish_max_backoff_ms / 1000, buckets=settings.publish_buckets,
                         logger=log)
        self.registry = registry
        self.settings = settings
        self.on_published = on_published
        self.broker_in_memory = broker_in_memory
        self.tracing = tracing  # ``infrastructure/tracing.Tracing``: a publish span per record stored with a trace
        self.buckets = settings.publish_buckets
        self.group: GroupLease = self.lease  # type: ignore[assignment]
        self.topics = topics_of(settings.kafka_topic_prefix, registry)
        self.producers = SharedProducer(settings, self.topics, f"commitline-{self.owner}")
        self.state: GroupState | None = None  # the group as the last rebalance saw it
        self._counts = PublisherMetrics()
        self._unowned_since: dict[int, float] = {}
        self._used: AIOKafkaProducer | None = None
        self._lag = 0
        self._unchecked: set[int] = set()  # buckets taken or resumed, the broker not checked for them yet
        self._records: RecordBuilder | None = None

    @property
    def metrics(self) -> PublisherMetrics:  # type: ignore[override]
        positions = {**{b: p for b, (p, _) in self._others.items()}, **self.positions}
        c = self._counts
        return PublisherMetrics(events_published=c.events_published, batches=c.batches, retries=c.retries,
                                position=min(positions.get(b, 0) for b in range(self.buckets)),
                                lag_events=self._lag, started_at=c.started_at)

    def moved(self) -> None:
        """The metrics' position is computed from the buckets' (``metrics``)."""

    def activated(self, slots: Sequence[int]) -> None:
        """Nothing is sent for these buckets before the broker was checked (``handle_page``)."""
        self._unchecked.update(slots)

    # -- the engine's hooks ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        reporter = asyncio.create_task(self._report_metrics(stop))
        try:
            await super().run(stop)
        finally:
            reporter.cancel()
            await self.producers.close()

    async def on_start(self) -> None:
        """Start the producer now: a broker that cannot take it stops the publisher at once, not at its first
        event (a broker not there yet is the rounds' outage to report). Warn first if the store may take events
        whose records the broker would not (they would stop the publisher when they come)."""
        largest, limit = self.settings.max_event_bytes, self.settings.kafka_max_message_bytes
        if largest + ENVELOPE_ALLOWANCE > limit:
            log.warning("COMMITLINE_MAX_EVENT_BYTES (%d) lets the store take events whose Kafka records (the event and "
                        "its envelope, up to about %d bytes) exceed COMMITLINE_KAFKA_MAX_MESSAGE_BYTES (%d): such an "
                        "event would stop the publisher until an operator skips it. Keep the event limit at least %d "
                        "bytes below the broker's", largest, largest + ENVELOPE_ALLOWANCE, limit, ENVELOPE_ALLOWANCE)
        try:
            async with self.producers.use():
                pass
        except (KafkaError, TopicSetupFailed, OSError, asyncio.TimeoutError) as error:
            # Said now: with nothing to publish yet (a drain of a caught-up store, say), no round would tell.
            log.warning("%s: the broker at %s cannot be reached yet (%s): nothing is published until it answers; "
                        "each batch tries again", PUBLISHER, self.settings.kafka_bootstrap_servers,
                        described(error))

    async def on_owner(self) -> None:
        if self.broker_in_memory:
            await self._republish_if_broker_is_new()
            self.broker_in_memory = False

    async def rebalance(self) -> None:
        state = await asyncio.to_thread(self.group.state)
        self.state = state
        plan = plan_rebalance(state, self.buckets, self.slots, self._unowned_since, time.monotonic())
        if plan.hand_over:
            log.info("%s: %s hands over buckets %s (%d members, share %d)", PUBLISHER, self.owner, plan.hand_over,
                     len(state.members), plan.share)
            await self.hand_back(plan.hand_over)
            return
        taken = await self.take(plan.candidates, plan.wanted)
        if taken:
            log.info("%s: %s took buckets %s (%d members, share %d)", PUBLISHER, self.owner, sorted(taken),
                     len(state.members), plan.share)

    def prepare(self, page: Page, positions: Mapping[int, int]) -> Records:
        """The page's records (in the reading thread), each bucket's up to its first record over the limit."""
        limit = self.settings.kafka_max_message_bytes
        build = self._builder().build
        built = Records({b: [build(n) for n in batch] for b, batch in page.events.items()}, {})
        # A record's size is estimated only when its value and type name come near the limit: what else it
        # holds (key, the other headers, the batch's framing) stays below SIZE_MARGIN plus the publisher's name.
        near = limit - SIZE_MARGIN - len(self.owner)
        for bucket, batch in built.records.items():
            for i, record in enumerate(batch):
                if len(record.value) + len(record.headers[1][1]) > near and (size := record_size(record)) > limit:
                    built.stop_at(page.events[bucket], bucket, i, positions[bucket], (
                        f"record of {size} bytes is larger than the broker's limit of {limit} bytes "
                        "(COMMITLINE_KAFKA_MAX_MESSAGE_BYTES)"))
                    break
        return built

    def _builder(self) -> RecordBuilder:
        """The record builder of the generation the instance joined under (a new one when that changes)."""
        generation = self.group.generation
        if self._records is None or self._records.generation != generation:
            self._records = RecordBuilder(self.settings.kafka_topic_prefix, self.owner, self.registry, generation)
        return self._records

    async def handle_page(self, page: Page, positions: Mapping[int, int]) -> dict[int, Handled]:
        if self._unchecked & set(positions):
            stop = await self._check_broker(positions)
            if stop is not None:
                self.reader.forget()
                return stop
            self._unchecked.difference_update(positions)
        built: Records = page.prepared
        self._used = None
        spans = self.tracing.publish_spans(built.records) if self.tracing is not None else None
        try:
            async with self.producers.use() as producer:
                self._used = producer
                acked = await self._send(producer, page, built, positions)
        except KafkaError as error:
            if spans:
                self.tracing.end_publish(spans.values(), error)
            raise
        if spans:
            self.tracing.end_publish(spans.values(), sent={r.notification_id for r in acked})
        self._counts.events_published += len(acked)  # acknowledged (counted before the positions show them)
        self._counts.batches += 1
        handled = {b: Handled(max(positions[b], page.through[b])) for b in page.events}
        handled.update({b: Handled(position, poison=poison) for b, (position, poison) in built.poisons.items()})
        if self.on_published is not None:
            self.on_published(acked)
        return handled

    async def on_failure(self, error: BaseException, attempt: int) -> None:
        self._counts.retries += 1
        await self.producers.discard(self._used)

    # -- sending -----------------------------------------------------------------------

    async def _send(self, producer: AIOKafkaProducer, page: Page, built: Records,
                    positions: Mapping[int, int]) -> list[KafkaRecord]:
        """Send every bucket's records (up to its first poison record) in one ``send_in_order``; a record batch
        the broker refuses as too large stops the bucket of its first record there. The records acknowledged."""
        while True:
            flat = [r for batch in built.records.values() for r in batch]
            try:
                await send_in_order(producer, flat)
                return flat
            except RecordRefused as refused:
                bucket = next(b for b, batch in built.records.items() if refused.record in batch)
                built.stop_at(page.events[bucket], bucket, built.records[bucket].index(refused.record),
                              positions[bucket],
                              f"the broker refused the record batch starting here as too large ({refused}); "
                              "set COMMITLINE_KAFKA_MAX_MESSAGE_BYTES to the broker's message.max.bytes")

    async def _check_broker(self, positions: Mapping[int, int]) -> dict[int, Handled] | None:
        """Every bucket in ``positions`` stopped (a ``store_went_back`` error, nothing sent) if the broker holds
        what the store went back behind; None if it agrees with the store (``broker_check.py``)."""
        records = await last_records(self.settings, self.topics)
        generation = self.group.generation

        def compare() -> tuple[tuple[str, Any] | None, int]:
            with self.recorder.datastore.get_connection() as conn:
                found = evidence(records, generation, lambda ids: event_ids_at(conn, self.recorder.datastore.schema,
                                                                               ids))
                return found, current_and_head(conn, self.recorder.datastore.schema)[1]

        found, head = await asyncio.to_thread(compare)
        if found is None:
            return None
        reason, record = found
        return {b: Handled(position, poison=went_back(
            self.group.names[b], reason, position=position, head=head, saved_generation=generation,
            generation=generation, new_generation=True, record=record.as_dict()))
            for b, position in positions.items()}

    # -- the embedded broker, metrics --------------------------------------------------

    async def _republish_if_broker_is_new(self) -> None:
        # A broker that keeps records in memory only (the embedded one) may be newer than the saved
        # positions: then everything goes to it again, so it never lacks what a position claims it has.
        highest = await asyncio.to_thread(self.group.highest_position)
        if highest > 0:
            await ensure_topics(self.settings, self.topics)
            if not await holds_records(self.settings, self.topics):
                log.warning("the embedded broker is new (it keeps records in memory only): publishing again from "
                            "the first event, not from position %d", highest)
                await asyncio.to_thread(self.group.reset_positions)

    async def _report_metrics(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_or_stop(stop, self.settings.metrics_interval_s)
            if stop.is_set():  # its buckets are being handed back: the stop's own summary says where it ended
                break
            try:
                head = await asyncio.to_thread(self.recorder.max_notification_id)
            except StoreUnavailable:
                continue
            metrics = self.metrics
            self._lag = max(0, (head or 0) - metrics.position)
            log.info("publisher metrics %s", json.dumps({"owner": self.owner, "buckets": self.owned,
                                                         **asdict(metrics), "lag_events": self._lag}))
