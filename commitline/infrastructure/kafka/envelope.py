"""The Kafka record for a stored event: topic, key, value envelope, headers, timestamp.

The payload is the stored JSON object exactly as written (no decode into domain types
and back), wrapped in an envelope with the event id (consumers deduplicate on it), type,
aggregate id and type, version, notification id, recorded-at time and tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import orjson
from eventsourcing.persistence import Notification

from commitline.domain import AGGREGATE_OF_EVENT, EVENT_TYPES


@dataclass(frozen=True, slots=True)
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


@lru_cache(maxsize=None)
def aggregate_type_of(event_type: str) -> str:
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise LookupError(f"no event class is registered for stored type {event_type!r}")
    return AGGREGATE_OF_EVENT[cls].__name__


@lru_cache(maxsize=1024)
def _encoded(text: str) -> bytes:
    return text.encode()


def to_record(notification: Notification, topic_prefix: str, publisher: str) -> KafkaRecord:
    # On the publisher's hot path: per-event work is kept to parsing, one dict and one dumps.
    stored = orjson.loads(notification.state)
    event_type = notification.topic
    aggregate_type = aggregate_type_of(event_type)
    aggregate_id = str(notification.originator_id)
    event_id = stored["id"]
    recorded_at = stored["at"]
    value = orjson.dumps({
        "event_id": event_id,
        "type": event_type,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "version": notification.originator_version,
        "notification_id": notification.id,
        "recorded_at": recorded_at,
        "tenant": stored["tenant"],
        "payload": stored["data"],
    })
    return KafkaRecord(
        topic_prefix + aggregate_type,
        aggregate_id.encode(),
        value,
        [("event_id", event_id.encode()), ("event_type", _encoded(event_type)), ("publisher", _encoded(publisher))],
        int(datetime.fromisoformat(recorded_at).timestamp() * 1000),
        notification.id,
        event_id,
    )
