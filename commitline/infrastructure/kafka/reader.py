"""Reading commitline's topics back from Kafka from the beginning (demo, tests, forensics)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from commitline.infrastructure.kafka.envelope import topic_for


@dataclass(frozen=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    key: str
    envelope: dict[str, Any]
    headers: dict[str, str]


def read_topics(bootstrap_servers: str, topic_prefix: str, expect_at_least: int, timeout: float = 60,
                quiet_for: float = 1.0, *, aggregate_types: Iterable[str] | None = None) -> list[ConsumedRecord]:
    """Every record of the prefix's topics (``<prefix><aggregate type>``, of the given aggregate types or of
    every one there is), sorted by (topic, partition, offset): read until at least ``expect_at_least``
    arrived and nothing new came for ``quiet_for`` seconds, or ``timeout`` passed."""
    wanted = None if aggregate_types is None else {topic_for(topic_prefix, name) for name in aggregate_types}

    def ours(topic: str) -> bool:
        if wanted is not None:
            return topic in wanted
        return topic.startswith(topic_prefix) and "." not in topic[len(topic_prefix):]

    async def read() -> list[ConsumedRecord]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        try:  # stopped even when its start fails
            await consumer.start()
            existing = await consumer.topics()  # metadata for all topics; creates none
            partitions = [
                TopicPartition(topic, p)
                for topic in sorted(existing) if ours(topic)
                for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            if not partitions:
                return []
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            records: list[ConsumedRecord] = []
            deadline = time.monotonic() + timeout
            quiet_since = time.monotonic()
            while time.monotonic() < deadline:
                fetched = [m for msgs in (await consumer.getmany(timeout_ms=200)).values() for m in msgs]
                if fetched:
                    quiet_since = time.monotonic()
                records.extend(
                    ConsumedRecord(m.topic, m.partition, m.offset, m.key.decode(), orjson.loads(m.value),
                                   {k: v.decode() for k, v in m.headers})
                    for m in fetched
                )
                if len(records) >= expect_at_least and time.monotonic() - quiet_since > quiet_for:
                    break
            return sorted(records, key=lambda r: (r.topic, r.partition, r.offset))
        finally:
            await consumer.stop()

    return asyncio.run(read())
