"""Reading every record of some topics back from a real broker, with an independent Kafka client
(confluent-kafka, i.e. librdkafka: not the aiokafka the publisher uses).

Each partition is read from its beginning to the log end the broker reports with the records it returns
(the high watermark of the fetch responses), by manual assignment, no consumer group. The offsets a
ListOffsets request answers are used only to know which partitions hold anything: the embedded broker
(Tansu) answers "latest" with the base offset of the batch written last (by time, not by offset), plus one,
so a read that stopped there would leave out the rest of that batch.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition


@dataclass(frozen=True)
class Read:
    """One record as read: where it was, and what it holds."""

    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: dict[str, bytes]
    timestamp_ms: int


def read_topics(bootstrap_servers: str, topics: list[str], timeout: float = 120) -> list[Read]:
    """Every record of ``topics`` (those that exist), in (topic, partition, offset) order; fails naming the
    partitions not read to their end within ``timeout`` seconds."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        metadata = consumer.list_topics(timeout=20)
        partitions = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics if t in metadata.topics
                      for p in metadata.topics[t].partitions]
        remaining = {(tp.topic, tp.partition) for tp in partitions
                     if consumer.get_watermark_offsets(tp, timeout=20)[1] > 0}
        consumer.assign(partitions)
        records: list[Read] = []
        next_offset: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + timeout
        while remaining:
            if time.monotonic() > deadline:
                ends = {tp: consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1] for tp in remaining}
                raise AssertionError(f"could not read to the end of {sorted(remaining)} in {timeout:g} s: read up to "
                                     f"{ {tp: next_offset.get(tp, 0) for tp in sorted(remaining)} }, log ends {ends}")
            for m in consumer.consume(num_messages=2000, timeout=0.5):
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    continue
                records.append(Read(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                    dict(m.headers() or []), m.timestamp()[1]))
                next_offset[(m.topic(), m.partition())] = m.offset() + 1
            for tp in list(remaining):
                end = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]  # the last fetch's
                if end > 0 and next_offset.get(tp, 0) >= end:
                    remaining.discard(tp)
        return sorted(records, key=lambda r: (r.topic, r.partition, r.offset))
    finally:
        consumer.close()
