"""Before a publisher sends anything for buckets it took: does the broker hold records the store lost?

Positions live in the store's database, so after a restore or an asynchronous failover they agree with its
shorter log; what does not is the broker, which may hold records of events the store no longer has (the
publisher sent them after the last commits that survived). Publishing on from the positions would put other
events under those notification ids. So when a publish instance takes buckets (at start, at a rebalance, after
joining again following a lost connection, after an operator's reset) it reads the last record of every
partition of every topic it publishes to, and compares each record of the store's current generation with the
store: the store must hold that notification id with the same event id. Records beyond a bucket's saved
position that the store holds are the normal case after a crash between sending and saving (they are sent
again: duplicates, never other events). A record the store lacks or holds another event for, or a record of a
generation newer than the store's (a restore from before it started), is evidence that the store went back:
the buckets stop (``followers/went_back.py``'s error) and nothing is sent. Records of older generations are
history an operator already dealt with (``commitline store new-generation`` and ``followers reset``).

Records are placed by aggregate key (``producer.partition_for``) and buckets by another hash of it
(``store/log.py``), so every bucket has records in every partition: the check is of the store as a whole,
and stops every bucket it was made for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaTimeoutError

from commitline.infrastructure.config import Settings
from commitline.infrastructure.kafka.producer import client_options

READ_SECONDS = 10.0


@dataclass(frozen=True)
class LastRecord:
    """The last record of one partition, as far as the check needs it."""

    topic: str
    partition: int
    offset: int
    notification_id: int
    event_id: str
    generation: int  # 1 for a record published before envelopes carried it

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _parse(topic: str, partition: int, offset: int, value: bytes | None) -> LastRecord | None:
    try:
        envelope = orjson.loads(value or b"")
        return LastRecord(topic, partition, offset, int(envelope["notification_id"]), str(envelope["event_id"]),
                          int(envelope.get("generation", 1)))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None  # not one of ours: nothing to compare


async def last_records(settings: Settings, topics: Sequence[str]) -> list[LastRecord]:
    """The last record of every non-empty partition of ``topics`` (a KafkaError when the broker fails, as for a
    send: the publisher backs off and tries again)."""
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False, request_timeout_ms=10_000)
    try:  # stopped even when its start fails: else an unclosed client per retry of an outage
        await consumer.start()
        known = await consumer.topics()
        partitions = [TopicPartition(t, p) for t in topics if t in known
                      for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not partitions:
            return []
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        wanted = {tp: ends[tp] - 1 for tp in partitions if ends[tp] > starts[tp]}
        if not wanted:
            return []
        consumer.assign(list(wanted))
        for tp, offset in wanted.items():
            consumer.seek(tp, offset)
        found: dict[TopicPartition, LastRecord | None] = {}
        deadline = time.monotonic() + READ_SECONDS
        while len(found) < len(wanted):
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"the last records of {len(wanted) - len(found)} partitions were not read "
                                           f"within {READ_SECONDS:g} s")
            for tp, messages in (await consumer.getmany(timeout_ms=200)).items():
                for m in messages:
                    if m.offset >= wanted[tp]:
                        found[tp] = _parse(m.topic, m.partition, m.offset, m.value)
                        consumer.pause(tp)
        return [r for r in found.values() if r is not None]
    finally:
        await consumer.stop()


def evidence(records: Sequence[LastRecord], generation: int,
             stored: Callable[[list[int]], dict[int, str]]) -> tuple[str, LastRecord] | None:
    """Why the store went back, with the record that shows it (None: the broker agrees with the store);
    ``stored`` gives the event id the store holds at each notification id it holds."""
    newer = [r for r in records if r.generation > generation]
    if newer:
        r = max(newer, key=lambda r: r.generation)
        return (f"Kafka holds records of store generation {r.generation} ({r.topic} partition {r.partition}), and "
                f"the store is in generation {generation}: it was restored from before that generation started (start "
                f"new generations until the store's is above {r.generation})"), r
    current = sorted((r for r in records if r.generation == generation), key=lambda r: -r.notification_id)
    if not current:
        return None
    held = stored([r.notification_id for r in current])
    for r in current:
        if r.notification_id not in held:
            return (f"Kafka holds notification {r.notification_id} (event {r.event_id}, {r.topic} partition "
                    f"{r.partition}) of this generation, and the store no longer has it"), r
        if held[r.notification_id] != r.event_id:
            return (f"Kafka holds notification {r.notification_id} as event {r.event_id} ({r.topic} partition "
                    f"{r.partition}), and the store holds another event ({held[r.notification_id]}) there"), r
    return None
