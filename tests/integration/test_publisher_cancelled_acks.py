"""A record batch whose acknowledgement the producer cancelled (aiokafka does when it resets its connections in
an outage) is unacknowledged: ``send_in_order`` raises a ``KafkaError``, which the publisher retries, never the
``CancelledError`` that would end the publish process with a bare traceback."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaError

from commitline.infrastructure.kafka.envelope import KafkaRecord
from commitline.infrastructure.kafka.producer import ensure_topics, new_producer, send_in_order
from tests.support import kafka_settings

pytestmark = pytest.mark.integration


class CancellingAcks:
    """A real producer whose batches' acknowledgements are cancelled, as aiokafka's reset cancels them."""

    def __init__(self, producer: Any):
        self.producer = producer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.producer, name)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        acknowledgement = await self.producer.send_batch(batch, topic, partition=partition)
        acknowledgement.cancel()
        return acknowledgement  # type: ignore[no-any-return]


def test_a_cancelled_acknowledgement_is_a_kafka_error_the_publisher_retries(pg_dsn: str, schema: str,
                                                                           kafka_bootstrap: str) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap)
    topic = f"{schema}.Cancelled"
    records = [KafkaRecord(topic, f"k{n}".encode(), b"{}", [], 0, n, f"e{n}") for n in range(1, 4)]

    async def send() -> BaseException | None:
        await ensure_topics(settings, [topic])
        producer = new_producer(settings, "cancelled-acks")
        await producer.start()
        try:
            await send_in_order(CancellingAcks(producer), records)  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - the test asserts what came out
            return e
        finally:
            await producer.stop()
        return None

    raised = asyncio.run(send())
    assert isinstance(raised, KafkaError), f"expected a KafkaError, got {raised!r}"
    assert "cancelled a record batch's acknowledgement" in str(raised)
