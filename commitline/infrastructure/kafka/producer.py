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
import ssl
from collections.abc import Sequence
from functools import lru_cache
from itertools import islice
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (KafkaConnectionError, MessageSizeTooLargeError, RecordListTooLargeError,
                             RecordTooLargeError)
from aiokafka.helpers import create_ssl_context
from aiokafka.partitioner import murmur2
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from commitline.application.errors import ConfigurationError
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
    """aiokafka's connection options (producer and admin alike): the brokers, the security protocol, an
    ``ssl_context`` for ``SSL``/``SASL_SSL`` (aiokafka refuses those without one) and the SASL credentials."""
    assert settings.kafka_bootstrap_servers is not None
    options: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap_servers,
        "security_protocol": settings.kafka_security_protocol,
    }
    if settings.kafka_security_protocol.endswith("SSL"):
        options["ssl_context"] = ssl_context(settings)
    if settings.kafka_security_protocol.startswith("SASL"):
        # Settings refuse SASL without a user and a password.
        assert settings.kafka_username is not None and settings.kafka_password is not None
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        options["sasl_plain_username"] = settings.kafka_username
        options["sasl_plain_password"] = settings.kafka_password.get_secret_value()
    return options


def ssl_context(settings: Settings) -> ssl.SSLContext:
    """Verifies the brokers' certificates and host names against ``COMMITLINE_KAFKA_SSL_CAFILE`` (else the
    system's CAs), presenting the client certificate when one is configured. A file that cannot be
    loaded raises ConfigurationError naming its variable."""
    try:
        context = create_ssl_context(cafile=settings.kafka_ssl_cafile)
    except (ssl.SSLError, OSError) as e:
        raise ConfigurationError("COMMITLINE_KAFKA_SSL_CAFILE", f"cannot be loaded: {e}") from None
    if settings.kafka_ssl_certfile is not None:
        secret = settings.kafka_ssl_key_password
        try:
            # A callable password: an encrypted key without one fails here instead of OpenSSL prompting on a tty.
            context.load_cert_chain(settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile,
                                    lambda: secret.get_secret_value() if secret else "")
        except (ssl.SSLError, OSError) as e:
            variable = "COMMITLINE_KAFKA_SSL_KEYFILE" if settings.kafka_ssl_keyfile else "COMMITLINE_KAFKA_SSL_CERTFILE"
            raise ConfigurationError(variable, f"client certificate and key cannot be loaded: {e}") from None
    return context


def idempotence_refused(settings: Settings, error: BaseException) -> ConfigurationError:
    """The broker answered the idempotent producer's InitProducerId with an error (Tansu, the embedded broker,
    does): a configuration to change, not an outage to wait out."""
    return ConfigurationError("COMMITLINE_KAFKA_IDEMPOTENCE", f"the broker at {settings.kafka_bootstrap_servers} "
                              f"refused the idempotent producer (InitProducerId: {type(error).__name__}): set "
                              "COMMITLINE_KAFKA_IDEMPOTENCE=false for a broker without it (such as the embedded "
                              "one), or enable idempotence on the broker")


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
    try:  # stopped even when its start fails
        await admin.start()
        response = await admin.create_topics(
            [NewTopic(t, settings.kafka_partitions, settings.kafka_replication_factor) for t in topics]
        )
        failed = [(t[0], t[1]) for t in response.topic_errors if t[1] not in (0, TOPIC_ALREADY_EXISTS)]
        if failed:
            raise TopicSetupFailed(f"could not create topics: {failed}")
    finally:
        await admin.close()


async def holds_records(settings: Settings, topics: Sequence[str]) -> bool:
    """Whether any partition of ``topics`` holds a record (an end offset above 0)."""
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False, request_timeout_ms=10_000)
    try:  # stopped even when its start fails
        await consumer.start()
        known = await consumer.topics()
        partitions = [TopicPartition(t, p) for t in topics if t in known
                      for p in consumer.partitions_for_topic(t) or ()]
        ends = await consumer.end_offsets(partitions) if partitions else {}
        return any(offset > 0 for offset in ends.values())
    finally:
        await consumer.stop()


@lru_cache(maxsize=200_000)
def partition_for(key: bytes, partitions: int) -> int:
    """The Java client's default partitioner (murmur2), so any Kafka client agrees on placement."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


async def send_in_order(producer: AIOKafkaProducer, records: Sequence[KafkaRecord]) -> None:
    """Send and wait for every record's acknowledgement; raise on the first failure (``RecordRefused``
    when the broker refused a batch as too large)."""
    counts: dict[str, int] = {}
    queues: dict[tuple[str, int], list[KafkaRecord]] = {}
    for record in records:  # no new list per record for a partition already met
        topic = record.topic
        count = counts.get(topic)
        if count is None:
            count = counts[topic] = len(await producer.partitions_for(topic))
        tp = (topic, partition_for(record.key, count))
        queue = queues.get(tp)
        if queue is None:
            queue = queues[tp] = []
        queue.append(record)
    sent = dict.fromkeys(queues, 0)  # how many of each partition's records are in a batch already
    while sent:
        firsts: list[KafkaRecord] = []
        acks = []
        for tp, start in list(sent.items()):
            queue = queues[tp]
            batch = producer.create_batch()
            append = batch.append
            firsts.append(queue[start])
            end = start
            # An empty batch takes its first record whatever its size: the caller checked it with record_size.
            for record in islice(queue, start, None):
                if append(key=record.key, value=record.value, timestamp=record.timestamp_ms,
                          headers=record.headers) is None:
                    break
                end += 1
            acks.append(await producer.send_batch(batch, tp[0], partition=tp[1]))
            if end == len(queue):
                del sent[tp]
            else:
                sent[tp] = end
        outcomes = await asyncio.gather(*acks, return_exceptions=True)
        refused = [(first, o) for first, o in zip(firsts, outcomes) if isinstance(o, TOO_LARGE)]
        if refused:
            first, error = min(refused, key=lambda r: r[0].notification_id)
            raise RecordRefused(first, error)
        for outcome in outcomes:
            if isinstance(outcome, asyncio.CancelledError):
                # The producer cancelled its own acknowledgement (it does on a reset in an outage); this task was
                # not cancelled (gather would have raised). Unacknowledged: a broker failure like any other.
                raise KafkaConnectionError("the producer cancelled a record batch's acknowledgement (the broker "
                                           "connection was reset); the batch is sent again") from outcome
            if isinstance(outcome, BaseException):
                raise outcome
