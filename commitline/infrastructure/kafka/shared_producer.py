"""The Kafka producer of a publish instance, shared by whatever of the instance sends with it.

It is created (and the topics ensured) on first use; a producer that failed is replaced by a new one on the
next use, and closed once nobody sends with it any more. A broker that refuses the idempotent producer is
a typed configuration error at once (no retry would change its answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, UnknownError

from commitline.infrastructure.config import Settings
from commitline.infrastructure.kafka.producer import ensure_topics, idempotence_refused, new_producer


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
