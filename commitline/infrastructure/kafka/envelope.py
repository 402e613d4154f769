"""The Kafka record for a stored event: topic, key, value envelope, headers, timestamp.

The payload is the stored JSON object as written (no decode into domain types and back), brought to
the event class's current version by its upcasters when it was stored at an older one, wrapped in an
envelope with the event id (consumers deduplicate on it), type, ``schema_version`` (the class version of
the payload it carries), aggregate id and type, version, notification id, the store generation it belongs
to (``store/generations.py``: a notification id names one event within one generation), recorded-at time
and tenant.
The topic is ``<prefix><aggregate type>``: one per aggregate type of the domain.

Personal fields stay sealed, as the store holds them (``{"ciphertext", "key_id"}``), and an event that has
any lists their names under ``personal`` (the stored event's ``pd``): an authorised consumer opens them with
``commitline.PersonalRecords``, others never see a plain value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import orjson
from eventsourcing.persistence import Notification

from commitline.domain import EventRegistry


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp_ms: int
    notification_id: int
    event_id: str
    traceparent: str | None = None  # of the append that stored the event (tracing on): the publish span's parent


# The JSON Schema of a record's value, as consumers may rely on it (the documentation's reference renders it).
ENVELOPE_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "commitline event envelope",
    "description": "The value of every Kafka record commitline publishes: one stored event. The record's key is "
    "the aggregate id (UTF-8); its headers are event_id, event_type, publisher, generation (as decimal text) and, "
    "when tracing is on, traceparent (W3C).",
    "type": "object",
    "additionalProperties": False,
    "required": ["event_id", "type", "schema_version", "aggregate_type", "aggregate_id", "version",
                 "notification_id", "generation", "recorded_at", "tenant", "payload"],
    "properties": {
        "event_id": {"type": "string", "format": "uuid",
                     "description": "unique per event; consumers deduplicate on it"},
        "type": {"type": "string", "description": "the event's stored type name"},
        "schema_version": {"type": "integer", "minimum": 1,
                           "description": "the event class's version the payload has (older ones upcast)"},
        "aggregate_type": {"type": "string", "description": "also the topic's suffix"},
        "aggregate_id": {"type": "string", "format": "uuid"},
        "version": {"type": "integer", "minimum": 1, "description": "the event's version in its aggregate"},
        "notification_id": {"type": "integer", "minimum": 1,
                            "description": "the event's position in the store's log (commit order), unique "
                            "within its generation"},
        "generation": {"type": "integer", "minimum": 1,
                       "description": "the store's history the event belongs to: it changes when an operator starts "
                       "a new one after a restore or an asynchronous failover (commitline store new-generation), "
                       "after which notification ids above that moment's head are used by other events. Records "
                       "of two generations with one notification_id are two different events; deduplicate by "
                       "event_id, and order or compare by (generation, notification_id)"},
        "recorded_at": {"type": "string", "format": "date-time"},
        "tenant": {"type": "string", "description": "the tenant whose stream it is"},
        "payload": {"type": "object", "description": "the event's own fields, as the domain declares them; each "
                    "personal one sealed: {\"ciphertext\": ..., \"key_id\": ...}"},
        "personal": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True,
                     "description": "only on events with personal fields: the names of the payload's sealed fields "
                     "(open them with commitline.PersonalRecords)"},
    },
}


def topic_for(prefix: str, aggregate_type: str) -> str:
    return f"{prefix}{aggregate_type}"


def topics_of(prefix: str, registry: EventRegistry) -> list[str]:
    """Every topic the domain's events go to."""
    return [topic_for(prefix, a.__name__) for a in registry.aggregates]


@lru_cache(maxsize=1024)
def _encoded(text: str) -> bytes:
    return text.encode()


def to_record(notification: Notification, topic_prefix: str, publisher: str, registry: EventRegistry,
              generation: int = 1) -> KafkaRecord:
    # On the publisher's hot path: per-event work is kept to parsing, one dict and one dumps.
    stored = orjson.loads(notification.state)
    event_type = notification.topic
    cls = registry.event_class(event_type)
    if cls is None:
        raise LookupError(f"no event class is registered for stored type {event_type!r}")
    aggregate_type = registry.aggregate_of_event[cls].__name__
    payload, version = stored["data"], stored.get("v", 1)
    if version < cls.class_version:
        payload, version = cls.upcast(payload, version), cls.class_version
    aggregate_id = str(notification.originator_id)
    event_id = stored["id"]
    recorded_at = stored["at"]
    envelope = {
        "event_id": event_id,
        "type": event_type,
        "schema_version": version,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "version": notification.originator_version,
        "notification_id": notification.id,
        "generation": generation,
        "recorded_at": recorded_at,
        "tenant": stored["tenant"],
        "payload": payload,
    }
    if "pd" in stored:
        envelope["personal"] = stored["pd"]
    value = orjson.dumps(envelope)
    return KafkaRecord(
        topic_prefix + aggregate_type,
        aggregate_id.encode(),
        value,
        [("event_id", event_id.encode()), ("event_type", _encoded(event_type)), ("publisher", _encoded(publisher)),
         ("generation", _encoded(str(generation)))],
        int(datetime.fromisoformat(recorded_at).timestamp() * 1000),
        notification.id,
        event_id,
        stored.get("tp"),
    )
