"""The Kafka record for a stored event: topic, key, value envelope, headers, timestamp.

The payload is the stored JSON object as written (no decode into domain types and back), brought to
the event class's current version by its upcasters when it was stored at an older one, wrapped in an
envelope with the event id (consumers deduplicate on it), type, ``schema_version`` (the class version of
the payload it carries), aggregate id and type, version, notification id, the store generation it belongs
to (``store/generations.py``: a notification id names one event within one generation, and an event sent again
under a later generation keeps its event_id), recorded-at time
and tenant.
The topic is ``<prefix><aggregate type>``: one per aggregate type of the domain.

Personal fields stay sealed, as the store holds them (``{"ciphertext", "key_id"}``), and an event that has
any lists their names under ``personal`` (the stored event's ``pd``): an authorised consumer opens them with
``commitline.PersonalRecords``, others never see a plain value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import orjson
from eventsourcing.persistence import Notification

from commitline.domain import EventRegistry


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs about 3x as much, once per event
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
                       "of two generations with one notification_id may be two different events, or one event sent "
                       "again under the new generation; deduplicate by event_id, and order by (generation, "
                       "notification_id)"},
        "recorded_at": {"type": "string", "format": "date-time"},
        "tenant": {"type": "string", "description": "the tenant whose stream it is"},
        "payload": {"type": "object", "description": "the event's own fields, as the domain declares them; each "
                    "personal one sealed: `{\"ciphertext\": ..., \"key_id\": ...}`"},
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


class RecordBuilder:
    """Builds the records of one publisher (one topic prefix, publisher name, registry and generation): what
    every event of a type shares (its class, topic, ``event_type`` header) and the headers every record shares
    are worked out once, an aggregate id's text once per aggregate (``str(UUID)`` is slow), so the per-event
    work is parsing the stored JSON, one dict and one ``orjson.dumps``."""

    def __init__(self, topic_prefix: str, publisher: str, registry: EventRegistry, generation: int = 1):
        self.topic_prefix = topic_prefix
        self.registry = registry
        self.generation = generation
        self._publisher = ("publisher", publisher.encode())
        self._generation = ("generation", str(generation).encode())
        self._types: dict[str, tuple[type, str, str, tuple[str, bytes]]] = {}
        self._ids: dict[int, tuple[str, bytes]] = {}

    def _of_type(self, event_type: str) -> tuple[type, str, str, tuple[str, bytes]]:
        cls = self.registry.event_class(event_type)
        if cls is None:
            raise LookupError(f"no event class is registered for stored type {event_type!r}")
        aggregate_type = self.registry.aggregate_of_event[cls].__name__
        known = self._types[event_type] = (cls, aggregate_type, topic_for(self.topic_prefix, aggregate_type),
                                           ("event_type", event_type.encode()))
        return known

    def build(self, notification: Notification) -> KafkaRecord:
        stored = orjson.loads(notification.state)
        event_type = notification.topic
        cls, aggregate_type, topic, type_header = self._types.get(event_type) or self._of_type(event_type)
        payload, version = stored["data"], stored.get("v", 1)
        if version < cls.class_version:  # type: ignore[attr-defined]
            payload, version = cls.upcast(payload, version), cls.class_version  # type: ignore[attr-defined]
        uid = notification.originator_id
        ids = self._ids.get(uid.int)  # an int key: a UUID's own __hash__ and __eq__ are Python code
        if ids is None:
            if len(self._ids) >= _IDS_KEPT:
                self._ids.clear()
            text = str(uid)
            ids = self._ids[uid.int] = (text, text.encode())
        event_id = stored["id"]
        recorded_at = stored["at"]
        envelope = {
            "event_id": event_id,
            "type": event_type,
            "schema_version": version,
            "aggregate_type": aggregate_type,
            "aggregate_id": ids[0],
            "version": notification.originator_version,
            "notification_id": notification.id,
            "generation": self.generation,
            "recorded_at": recorded_at,
            "tenant": stored["tenant"],
            "payload": payload,
        }
        if "pd" in stored:
            envelope["personal"] = stored["pd"]
        return KafkaRecord(
            topic,
            ids[1],
            orjson.dumps(envelope),
            [("event_id", event_id.encode()), type_header, self._publisher, self._generation],
            int(datetime.fromisoformat(recorded_at).timestamp() * 1000),
            notification.id,
            event_id,
            stored.get("tp"),
        )


#: Aggregate ids whose text a ``RecordBuilder`` keeps (then it starts over).
_IDS_KEPT = 100_000


def to_record(notification: Notification, topic_prefix: str, publisher: str, registry: EventRegistry,
              generation: int = 1) -> KafkaRecord:
    """The record of one stored event (a publisher builds many with one ``RecordBuilder``)."""
    return RecordBuilder(topic_prefix, publisher, registry, generation).build(notification)
