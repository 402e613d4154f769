"""Producing records to Kafka in per-partition order, even when a send fails.

aiokafka keeps one request in flight per broker, but when a batch finally fails, a later
batch of the same partition that was already queued may still be delivered, so the
partition would hold event 3 without event 2. ``send_in_order`` therefore sends in
waves: at most one record batch per partition per wave (a record batch is appended
atomically), and the next wave only after every batch of this one is acknowledged. A
failure stops the sending before anything later of that partition leaves the process.

Size: a record batch never exceeds the broker's ``message.max.bytes``
(``COMMITLINE_KAFKA_MAX_MESSAGE_BYTES``): batches of several records stay below it, and
``record_size`` lets the publisher hold back a single record that is larger. A batch the
broker refuses as too large anyway raises ``RecordRefused`` naming its first record.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError
from aiokafka.partitioner import murmur2
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from commitline.infrastructure.config import Settings
from commitline.infrastructure.kafka.envelope import KafkaRecord

BATCH_BYTES = 512 * 1024
TOPIC_ALREADY_EXISTS = 36


TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError)


class TopicSetupFailed(RuntimeError):
    pass


class RecordRefused(Exception):
    """The broker refused the record batch starting with ``record`` as too large."""

    def __init__(self, record: KafkaRecord, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.record = record
        self.error = error


def record_size(record: KafkaRecord) -> int:
    """An upper bound of the record's size in a record batch of its own: what the broker compares
    with ``message.max.bytes``."""
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(record.key, record.value, record.headers)


def client_options(settings: Settings) -> dict[str, Any]:
    assert settings.kafka_bootstrap_servers is not None
    options: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap_servers,
        "security_protocol": settings.kafka_security_protocol,
    }
    if settings.kafka_security_protocol.startswith("SASL"):
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        options["sasl_plain_username"] = settings.kafka_username
        options["sasl_plain_password"] = settings.kafka_password.get_secret_value() if settings.kafka_password else None
    return options


def new_producer(settings: Settings, client_id: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        **client_options(settings),
        client_id=client_id,
        acks="all",
        enable_idempotence=settings.kafka_idempotence,
        max_batch_size=min(BATCH_BYTES, settings.kafka_max_message_bytes),
        max_request_size=max(4 * BATCH_BYTES, settings.kafka_max_message_bytes),
        linger_ms=0,
        request_timeout_ms=10_000,
        retry_backoff_ms=200,
    )


async def ensure_topics(settings: Settings, topics: Sequence[str]) -> None:
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=10_000)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(t, settings.kafka_partitions, settings.kafka_replication_factor) for t in topics]
        )
        failed = [(t[0], t[1]) for t in response.topic_errors if t[1] not in (0, TOPIC_ALREADY_EXISTS)]
        if failed:
            raise TopicSetupFailed(f"could not create topics: {failed}")
    finally:
        await admin.close()


@lru_cache(maxsize=200_000)
def partition_for(key: bytes, partitions: int) -> int:
    """The Java client's default partitioner (murmur2), so any Kafka client agrees on placement."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


async def send_in_order(producer: AIOKafkaProducer, records: Sequence[KafkaRecord]) -> None:
    """Send and wait for every record's acknowledgement; raise on the first failure (``RecordRefused``
    when the broker refused a batch as too large)."""
    counts: dict[str, int] = {}
    queues: dict[tuple[str, int], deque[KafkaRecord]] = {}
    for record in records:
        if record.topic not in counts:
            counts[record.topic] = len(await producer.partitions_for(record.topic))
        tp = (record.topic, partition_for(record.key, counts[record.topic]))
        queues.setdefault(tp, deque()).append(record)
    while queues:
        firsts: list[KafkaRecord] = []
        acks = []
        for tp, queue in list(queues.items()):
            batch = producer.create_batch()
            firsts.append(queue[0])
            # An empty batch takes its first record whatever its size: the caller checked it with record_size.
            while queue and batch.append(
                key=queue[0].key, value=queue[0].value, timestamp=queue[0].timestamp_ms, headers=queue[0].headers
            ) is not None:
                queue.popleft()
            acks.append(await producer.send_batch(batch, tp[0], partition=tp[1]))
            if not queue:
                del queues[tp]
        outcomes = await asyncio.gather(*acks, return_exceptions=True)
        refused = [(first, o) for first, o in zip(firsts, outcomes) if isinstance(o, TOO_LARGE)]
        if refused:
            first, error = min(refused, key=lambda r: r[0].notification_id)
            raise RecordRefused(first, error)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
