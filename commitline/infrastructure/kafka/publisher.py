"""The Kafka publisher: follows the notification log and publishes every event, in order.

This is one stream's publisher (``COMMITLINE_PUBLISH_BUCKETS=1`` behaves like it). ``commitline publish``
runs ``partitioned.PartitionedPublisher``, which publishes every bucket of aggregates it owns in one loop,
reading the log once per round, with this module's batch handling and a position per bucket.

Loop, while holding the ``kafka-publisher`` lease:
  read the next batch after the saved position (gap-safe) -> build records ->
  send in per-partition order and wait for every ack (acks=all) -> save the position.
The position moves only after the broker acknowledged everything up to it, so a crash
at any instant means some records may be sent again on restart, never lost, never
reordered per aggregate. Each record carries its event id for consumer deduplication.

While the broker fails, the batch is retried with bounded exponential back-off; the
outage is logged once when it starts and once when it ends. Commands keep working: the
command path never talks to Kafka.

A record the broker cannot take (larger than ``COMMITLINE_KAFKA_MAX_MESSAGE_BYTES``, or
refused by the broker as too large) is a poison record, never retried on its own: the
events before it are published, the publisher stops at it with the reason in ``status``,
and waits for an operator: ``commitline publisher retry`` (after raising the limit) or
``commitline publisher skip --position N`` (kept in the intervention log).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from eventsourcing.persistence import Notification

from commitline.domain import AGGREGATES
from commitline.infrastructure.config import Settings
from commitline.infrastructure.kafka.envelope import KafkaRecord, to_record, topic_for
from commitline.infrastructure.followers.engine import Follower, Handled
from commitline.infrastructure.followers.wakeup import wait_or_stop
from commitline.infrastructure.kafka.producer import (
    RecordRefused,
    ensure_topics,
    holds_records,
    new_producer,
    record_size,
    send_in_order,
)
from commitline.infrastructure.store.recorder import EventRecorder

log = logging.getLogger(__name__)
PUBLISHER = "kafka-publisher"
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


class KafkaPublisher(Follower):
    retry_on = (KafkaError,)
    outage_subject = "kafka"  # "kafka unavailable ..." once per outage, "kafka available again ..." once

    def __init__(
        self,
        recorder: EventRecorder,
        conninfo: dict,
        settings: Settings,
        *,
        owner: str | None = None,
        on_published: Callable[[Sequence[KafkaRecord]], None] | None = None,
        broker_in_memory: bool = False,
    ):
        super().__init__(recorder, conninfo, PUBLISHER, batch_size=settings.publish_batch_size,
                         poll_interval=settings.publish_poll_interval_ms / 1000, owner=owner,
                         max_backoff=settings.publish_max_backoff_ms / 1000)
        self.settings = settings
        self.metrics = PublisherMetrics()
        self.on_published = on_published
        self.topics = [topic_for(settings.kafka_topic_prefix, a.__name__) for a in AGGREGATES]
        self._producer: AIOKafkaProducer | None = None
        self._acked: list[KafkaRecord] = []
        self.broker_in_memory = broker_in_memory

    async def on_owner(self) -> None:
        # A broker that keeps records in memory only (the embedded one) may be newer than the saved
        # position: then everything goes to it again, so it never lacks what the position claims it has.
        if not self.broker_in_memory:
            return
        position, _ = await asyncio.to_thread(self.lease.own_row)
        if position > 0:
            await ensure_topics(self.settings, self.topics)
            if not await holds_records(self.settings, self.topics):
                log.warning("the embedded broker is new (it keeps records in memory only): publishing again from "
                            "the first event, not from position %d", position)
                await asyncio.to_thread(self.lease.save_position, 0)

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop`` is set; then finish the batch in hand, release the lease, return."""
        reporter = asyncio.create_task(self._report_metrics(stop))
        try:
            await super().run(stop)
        finally:
            reporter.cancel()

    async def handle(self, batch: Sequence[Notification], position: int) -> Handled:
        records = [to_record(n, self.settings.kafka_topic_prefix, self.owner) for n in batch]
        end, reason = len(records), ""
        limit = self.settings.kafka_max_message_bytes
        for i, record in enumerate(records):
            if (size := record_size(record)) > limit:
                end, reason = i, (f"record of {size} bytes is larger than the broker's limit of {limit} bytes "
                                  "(COMMITLINE_KAFKA_MAX_MESSAGE_BYTES)")
                break
        async with self._batch_producer() as producer:
            while True:  # send everything before the first record the broker cannot take
                try:
                    await send_in_order(producer, records[:end])
                    break
                except RecordRefused as refused:
                    end = records.index(refused.record)
                    reason = (f"the broker refused the record batch starting here as too large ({refused}); "
                              "set COMMITLINE_KAFKA_MAX_MESSAGE_BYTES to the broker's message.max.bytes")
        self._acked = records[:end]
        if end == len(records):
            return Handled(batch[-1].id)
        stopped = batch[end]
        poison = {"position": stopped.id, "event_type": stopped.topic, "aggregate_id": str(stopped.originator_id),
                  "version": stopped.originator_version, "message": reason}
        return Handled(batch[end - 1].id if end else position, poison=poison)

    async def on_failure(self, error: BaseException, attempt: int) -> None:
        self.metrics.retries += 1
        await self._close_producer()

    async def on_saved(self, batch: Sequence[Notification], handled: Handled) -> None:
        m = self.metrics
        m.events_published += len(self._acked)
        m.batches += 1
        if self.on_published is not None:
            self.on_published(self._acked)

    async def on_stop(self) -> None:
        await self._close_producer()

    @asynccontextmanager
    async def _batch_producer(self) -> AsyncIterator[AIOKafkaProducer]:
        """The producer to send a batch with (a bucket worker's is shared with the others of its instance)."""
        yield await self._producer_ready()

    async def _producer_ready(self) -> AIOKafkaProducer:
        if self._producer is None:
            await ensure_topics(self.settings, self.topics)
            producer = new_producer(self.settings, f"commitline-{self.owner}")
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await asyncio.wait_for(producer.stop(), timeout=15)
            except (KafkaError, asyncio.TimeoutError, OSError):
                pass

    async def _report_metrics(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_or_stop(stop, self.settings.metrics_interval_s)
            head = await asyncio.to_thread(self.recorder.max_notification_id)
            self.metrics.lag_events = max(0, (head or 0) - self.metrics.position)
            log.info("publisher metrics %s", json.dumps({"owner": self.owner, **asdict(self.metrics)}))
