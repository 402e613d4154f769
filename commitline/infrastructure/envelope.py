"""The Kafka record for a stored event: topic, key, value envelope, headers, timestamp.

The payload is the stored JSON object exactly as written (no decode into domain types
and back), wrapped in an envelope with the event id (consumers deduplicate on it), type,
aggregate id and type, version, notification id, recorded-at time and tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import orjson
from eventsourcing.persistence import Notification

from commitline.domain import AGGREGATE_OF_EVENT, EVENT_TYPES


@dataclass(frozen=True)
class KafkaRecord:
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp_ms: int
    notification_id: int
    event_id: str


def topic_for(prefix: str, aggregate_type: str) -> str:
    return f"{prefix}{aggregate_type}"


def aggregate_type_of(event_type: str) -> str:
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise LookupError(f"no event class is registered for stored type {event_type!r}")
    return AGGREGATE_OF_EVENT[cls].__name__


def to_record(notification: Notification, topic_prefix: str, publisher: str) -> KafkaRecord:
    stored = orjson.loads(notification.state)
    aggregate_type = aggregate_type_of(notification.topic)
    aggregate_id = str(notification.originator_id)
    envelope = {
        "event_id": stored["id"],
        "type": notification.topic,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "version": notification.originator_version,
        "notification_id": notification.id,
        "recorded_at": stored["at"],
        "tenant": stored["tenant"],
        "payload": stored["data"],
    }
    return KafkaRecord(
        topic=topic_for(topic_prefix, aggregate_type),
        key=aggregate_id.encode(),
        value=orjson.dumps(envelope),
        headers=[
            ("event_id", stored["id"].encode()),
            ("event_type", notification.topic.encode()),
            ("publisher", publisher.encode()),
        ],
        timestamp_ms=int(datetime.fromisoformat(stored["at"]).timestamp() * 1000),
        notification_id=notification.id,
        event_id=stored["id"],
    )
