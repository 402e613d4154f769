"""The Kafka publisher: follows the notification log and publishes every event, in order.

Loop, while holding the ``kafka-publisher`` lease:
  read the next batch after the saved position (gap-safe) -> build records ->
  send in per-partition order and wait for every ack (acks=all) -> save the position.
The position moves only after the broker acknowledged everything up to it, so a crash
at any instant means some records may be sent again on restart, never lost, never
reordered per aggregate. Each record carries its event id for consumer deduplication.

While the broker fails, the batch is retried with bounded exponential back-off; the
outage is logged once when it starts and once when it ends. Commands keep working: the
command path never talks to Kafka.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from commitline.domain import AGGREGATES
from commitline.infrastructure.config import Settings
from commitline.infrastructure.kafka.envelope import KafkaRecord, to_record, topic_for
from commitline.infrastructure.followers.engine import LeasedFollower
from commitline.infrastructure.kafka.producer import ensure_topics, new_producer, send_in_order
from commitline.infrastructure.followers.lease import Lease, instance_id
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.followers.wakeup import LogWakeup, wait_or_stop

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


class KafkaPublisher(LeasedFollower):
    def __init__(
        self,
        recorder: EventRecorder,
        conninfo: dict,
        settings: Settings,
        *,
        owner: str | None = None,
        on_published: Callable[[Sequence[KafkaRecord]], None] | None = None,
    ):
        self.recorder = recorder
        self.settings = settings
        self.owner = owner or instance_id()
        self.lease = Lease(conninfo, settings.schema_name, PUBLISHER, self.owner)
        self.wakeup = LogWakeup(conninfo, recorder.channel_name)
        self.metrics = PublisherMetrics()
        self.on_published = on_published
        self.on_caught_up: Callable[[], None] | None = None
        self.topics = [topic_for(settings.kafka_topic_prefix, a.__name__) for a in AGGREGATES]
        self._producer: AIOKafkaProducer | None = None
        self._outage_started: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop`` is set; then finish the batch in hand, release the lease, return."""
        reporter = asyncio.create_task(self._report_metrics(stop))
        try:
            await super().run(stop)
        finally:
            reporter.cancel()

    async def on_stop(self) -> None:
        await self._close_producer()

    async def work_while_owner(self, stop: asyncio.Event) -> None:
        position = await asyncio.to_thread(self.lease.position)
        self.metrics.position = position
        log.info("publisher %s active from position %d", self.owner, position)
        attempt = 0
        while not stop.is_set():
            batch = await asyncio.to_thread(
                self.recorder.select_notifications, position + 1, self.settings.publish_batch_size
            )
            if not batch:
                if self.on_caught_up is not None and await self._caught_up(position):
                    self.on_caught_up()
                    if stop.is_set():
                        continue
                await self.wakeup.wait(self.settings.publish_poll_interval_ms / 1000)
                continue
            records = [to_record(n, self.settings.kafka_topic_prefix, self.owner) for n in batch]
            try:
                await send_in_order(await self._producer_ready(), records)
            except KafkaError as e:
                attempt += 1
                await self._on_failure(e, attempt, stop)
                continue
            position = batch[-1].id
            await asyncio.to_thread(self.lease.save_position, position)
            if attempt:
                self._on_recovery(attempt)
                attempt = 0
            self._count(records, position)

    async def _caught_up(self, position: int) -> bool:
        # An empty read can also mean a gap still being proven; only the head tells them apart.
        head = await asyncio.to_thread(self.recorder.max_notification_id)
        return (head or 0) <= position

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

    async def _on_failure(self, error: Exception, attempt: int, stop: asyncio.Event) -> None:
        self.metrics.retries += 1
        delay = min(self.settings.publish_max_backoff_ms / 1000, 0.2 * 2 ** min(attempt, 20)) * random.uniform(0.5, 1)
        if self._outage_started is None:
            self._outage_started = time.monotonic()
            log.error("kafka unavailable (%s: %s); events stay in the store, retrying with back-off up to %.1f s",
                      type(error).__name__, error, self.settings.publish_max_backoff_ms / 1000)
        else:
            log.debug("kafka still unavailable after %d attempts (%s)", attempt, type(error).__name__)
        await self._close_producer()
        await wait_or_stop(stop, delay)

    def _on_recovery(self, attempts: int) -> None:
        down_for = time.monotonic() - (self._outage_started or time.monotonic())
        self._outage_started = None
        log.warning("kafka available again after %.1f s and %d failed attempts; catching up", down_for, attempts)

    def _count(self, records: Sequence[KafkaRecord], position: int) -> None:
        m = self.metrics
        m.events_published += len(records)
        m.batches += 1
        m.position = position
        if self.on_published is not None:
            self.on_published(records)

    async def _report_metrics(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_or_stop(stop, self.settings.metrics_interval_s)
            head = await asyncio.to_thread(self.recorder.max_notification_id)
            self.metrics.lag_events = max(0, (head or 0) - self.metrics.position)
            log.info("publisher metrics %s", json.dumps({"owner": self.owner, **asdict(self.metrics)}))
