"""Turning domain events and aggregate snapshots into stored bytes and back.

Stored JSON is plain (no type tags): Decimals as strings, UUIDs as strings, datetimes as
ISO 8601 with offset, sets as sorted lists. The exact Python types come back from the
classes' own annotations (a cached pydantic ``TypeAdapter`` per class), so a stored
payload is readable by any consumer and decodes to values equal to what was written.

Stored event state layout: ``{"id", "at", "tenant", "data"}`` plus ``"v"`` (the event
class version) when it is above 1; old versions are upcast on read. An event with personal fields
(``domain.personal``) holds each of them sealed in ``data`` (``personal/cipher.py``) and their names in
``"pd"``; they are sealed here, before the chain hashes the stored bytes, and opened on decode, before
upcasting (an erased one as ``ERASED``).

Decoding needs the domain's event classes: an ``EventCodec`` holds one domain's ``EventRegistry``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any
from uuid import UUID

import orjson
from eventsourcing.persistence import StoredEvent
from pydantic import TypeAdapter, ValidationError

from commitline.application.errors import ConfigurationError
from commitline.application.results import json_default
from commitline.domain import Aggregate, Event, EventRegistry
from commitline.domain.errors import InvalidValue
from commitline.domain.decimals import scalar_fields
from commitline.domain.personal import personal_fields, subject_of

if TYPE_CHECKING:
    from commitline.infrastructure.personal.cipher import NewKeys, PersonalData

_OPTIONS = orjson.OPT_SORT_KEYS


def dumps(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, the project's type rules."""
    return orjson.dumps(value, default=json_default, option=_OPTIONS)


@cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


@dataclass(frozen=True)
class RecordedEvent:
    """A stored event as read back: the domain event plus what the store knows about it."""

    event: Event
    tenant: str
    aggregate_type: str

    @property
    def type(self) -> str:
        return self.event.type_name()

    def as_dict(self) -> dict[str, Any]:
        e = self.event
        return {
            "event_id": str(e.event_id),
            "type": self.type,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": str(e.aggregate_id),
            "version": e.version,
            "occurred_at": e.occurred_at.isoformat(),
            "tenant": self.tenant,
            "payload": orjson.loads(dumps(e.payload())),
        }


class UnknownEventType(ConfigurationError):
    """A stored event of a type the domain does not declare: written by a newer release whose domain declares it
    (a process still running the older one meets it), or by another domain. A configuration error like an event
    stored at a newer class_version: the running code does not fit the store, and reading on would guess."""

    variable = "COMMITLINE_APP"

    def __init__(self, topic: str):
        super().__init__(reason=f"no event class is registered for stored type {topic!r}: the release that wrote "
                         "it declares it; run that release (or a newer one) with this store")


_new = object.__new__

#: The base ``Event.upcast``: an event class that keeps it has nothing to upcast at its own version.
_EVENT_UPCAST = Event.upcast.__func__  # type: ignore[attr-defined]


def encode_event(event: Event, tenant: str, traceparent: str | None = None, *, personal: PersonalData | None = None,
                 aggregate: Aggregate | None = None, new_keys: NewKeys | None = None) -> StoredEvent:
    """``traceparent``: the W3C trace context of the append that writes it (tracing on), kept so that its
    publication continues the command's trace. ``personal`` seals the event's personal fields, each under the
    data key of the subject its declaration names (a field of the event, else an attribute of ``aggregate``);
    without it they are written as they are (tests and tools writing events directly: the event store's codec
    always has it). ``new_keys``: where the keys of new subjects go, for the append to insert them (without it,
    each is inserted at once, in a transaction of its own)."""
    data = event.payload()
    state: dict[str, Any] = {"id": event.event_id, "at": event.occurred_at, "tenant": tenant, "data": data}
    if personal is not None and (fields := personal_fields(type(event))):
        state["pd"] = _seal(event, tenant, data, fields, personal, aggregate, new_keys)
    if event.class_version != 1:
        state["v"] = event.class_version
    if traceparent:
        state["tp"] = traceparent
    return StoredEvent(
        originator_id=event.aggregate_id,
        originator_version=event.version,
        topic=event.type_name(),
        state=dumps(state),
    )


def _seal(event: Event, tenant: str, data: dict[str, Any], fields: tuple[tuple[str, str], ...],
          personal: PersonalData, aggregate: Aggregate | None, new_keys: NewKeys | None) -> list[str]:
    event_id = str(event.event_id)
    for name, subject in fields:
        who = subject_of(event, aggregate, subject)
        if who is None or who == "":
            raise InvalidValue(subject, who, f"names the data subject of {event.type_name()}.{name}: it must be set")
        # a subject that is the id of the stream this event starts is most likely new (a payment its own holder)
        fresh = new_keys is not None and event.version == 1 and str(who) == str(event.aggregate_id)
        data[name] = personal.seal(tenant, str(who), event_id, name, data[name], dumps(data[name]), new_keys, fresh)
    return [name for name, _ in fields]


# The data key id of a sealed value as it stands in a stored state's JSON (``personal/cipher.py``: KEY_ID).
_SEALED_KEY_ID = re.compile(rb'"key_id":"([0-9a-f-]{36})"')


class EventCodec:
    """Decoding stored events into one domain's event classes (upcast to their current version)."""

    def __init__(self, registry: EventRegistry, personal: PersonalData | None = None):
        self.registry = registry
        self.personal = personal
        # by stored type name (``_decoder``)
        self._decoders: dict[str, tuple[type[Event], Any, frozenset[str], tuple[tuple[str, str], ...]]] = {}

    def encode(self, event: Event, tenant: str, traceparent: str | None = None,
               aggregate: Aggregate | None = None, new_keys: NewKeys | None = None) -> StoredEvent:
        """``encode_event`` with this codec's keys for personal fields."""
        return encode_event(event, tenant, traceparent, personal=self.personal, aggregate=aggregate,
                            new_keys=new_keys)

    def preload_keys(self, states: Iterable[bytes]) -> None:
        """Read the data keys of a batch of stored states (those with personal fields) in one statement, before
        the batch is decoded one event at a time."""
        if self.personal is not None:
            ids = {UUID(found.decode()) for state in states if b'"pd":' in state
                   for found in _SEALED_KEY_ID.findall(state)}
            if ids:
                self.personal.preload(ids)

    def opened(self, stored: dict[str, Any]) -> dict[str, Any]:
        """A stored state's ``data`` with its personal fields opened (plain JSON values, or ERASED)."""
        if self.personal is None:
            raise ConfigurationError("COMMITLINE_MASTER_KEY", "stored events hold personal fields, and this store "
                                     "has no key for them")
        data, tenant, event_id = dict(stored["data"]), stored["tenant"], stored["id"]
        for name in stored["pd"]:
            data[name] = self.personal.open(tenant, event_id, name, data[name])
        return data

    def decode_event(self, topic: str, originator_id: UUID, originator_version: int, state: bytes) -> RecordedEvent:
        stored = orjson.loads(state)
        event = self.decode_state(topic, originator_id, originator_version, stored)
        # ``RecordedEvent(event=..., tenant=..., aggregate_type=...)``, equal to it: a frozen dataclass's
        # ``__init__`` sets each field through ``object.__setattr__``, twice the cost, once per event a
        # projection or a rebuild reads
        recorded = _new(RecordedEvent)
        d = recorded.__dict__
        d["event"], d["tenant"], d["aggregate_type"] = (
            event, stored["tenant"], self.registry.aggregate_of_event[type(event)].__name__)
        return recorded

    def decode_state(self, topic: str, originator_id: UUID, originator_version: int, stored: dict[str, Any]) -> Event:
        """The domain event of a stored state already parsed (``orjson.loads`` of it, which this may change):
        ``decode_event``'s event without the rest of its ``RecordedEvent``, for a replay (the same validation,
        personal fields opened and old versions upcast the same way; only fewer objects made)."""
        decoder = self._decoders.get(topic)
        if decoder is None:
            decoder = self._decoder(topic)
        cls, validate, fields, scalars = decoder
        version = int(stored["v"]) if "v" in stored else 1  # the class version it was written at
        if version > cls.class_version:  # written by a newer release: reading it as this one would drop fields
            raise ConfigurationError("COMMITLINE_APP", f"{topic} event {originator_id} v{originator_version} was stored "
                                     f"at class version {version}, newer than this release's {cls.class_version}: "
                                     "run the release that wrote it (or a newer one)")
        data = self.opened(stored) if "pd" in stored else stored["data"]
        if version != cls.class_version or cls.upcast.__func__ is not _EVENT_UPCAST:  # type: ignore[attr-defined]
            data = cls.upcast(data, version)
        if data.keys() != fields:
            check_renames(cls, topic, originator_id, originator_version, version, data.keys() - fields,
                          fields - data.keys())
        for name, declared in scalars:
            if type(data.get(name)) is str:
                raise typed_as_text(cls, topic, originator_id, originator_version, version, name, declared, data[name])
        if data is stored["data"]:  # the parsed state's own dict, nobody else's: filled in place
            data["event_id"], data["aggregate_id"] = stored["id"], originator_id
            data["version"], data["occurred_at"] = originator_version, stored["at"]
        else:
            data = {**data, "event_id": stored["id"], "aggregate_id": originator_id, "version": originator_version,
                    "occurred_at": stored["at"]}
        try:
            return validate(data)  # type: ignore[no-any-return]
        except ValidationError as e:
            raise unfitting(cls, topic, originator_id, originator_version, version, e) from None

    def _decoder(self, topic: str) -> tuple[type[Event], Any, frozenset[str], tuple[tuple[str, str], ...]]:
        """(event class, its validator, its payload's field names, its JSON-number and boolean fields with their
        declared type's name) of a stored type name."""
        cls = self.registry.event_class(topic)
        if cls is None:
            raise UnknownEventType(topic)
        decoder = (cls, _adapter(cls).validator.validate_python, frozenset(cls.payload_fields()),
                   scalar_fields(cls, cls.ENVELOPE))
        self._decoders[topic] = decoder
        return decoder


def check_renames(cls: type[Event], topic: str, originator_id: UUID, originator_version: int, version: int,
                  undeclared: set[str], missing: set[str]) -> None:
    """Refuse a stored payload (after any upcasting) that holds fields its class does not declare while it lacks
    some the class does: most likely a field renamed, which would be read as its new name's default while the
    stored value is dropped. Only one of the two is fine: an undeclared field alone is one a later release added or
    this one removed (ignored), a missing one alone is a field added since (its default, or ``unfitting``)."""
    if not undeclared or not missing:
        return
    raise ConfigurationError(
        "the domain", f"the {topic} event at version {originator_version} of stream {originator_id}, stored at "
        f"class_version {version}, holds {', '.join(sorted(undeclared))}, which {cls.__module__}.{cls.__qualname__} "
        f"(class_version {cls.class_version}) does not declare, and lacks its {', '.join(sorted(missing))}: read "
        f"as it is, a renamed field would take its default and the stored value would be lost. A field renamed or "
        f"replaced needs the class a new class_version and an upcaster that moves the stored value "
        f"(upcast_v{cls.class_version}_v{cls.class_version + 1}); a field removed while another was added, an "
        f"upcaster that drops it")


def typed_as_text(cls: type[Event], topic: str, originator_id: UUID, originator_version: int, version: int, name: str,
                  declared: str, value: str) -> ConfigurationError:
    """A stored payload holding text where its class declares a number or a boolean, which JSON stores as such:
    the field's type changed (a Decimal, stored as text, now declared float, say). Validated as it is, the text
    would be converted silently (``"10.05"`` read as the float 10.05, ``"10"`` as the int 10)."""
    shown = value if len(value) <= 40 else value[:40] + "..."
    return ConfigurationError(
        "the domain", f"the {topic} event at version {originator_version} of stream {originator_id}, stored at "
        f"class_version {version}, does not fit {cls.__module__}.{cls.__qualname__} (class_version "
        f"{cls.class_version}): {name} is stored as the text {shown!r}, and the class declares it {declared}, "
        f"which is never stored as text: the field's type changed (from Decimal or str, say). A field whose type "
        f"changed needs the class a new class_version and an upcaster that converts the values already stored "
        f"(upcast_v{cls.class_version}_v{cls.class_version + 1})")


def unfitting(cls: type[Event], topic: str, originator_id: UUID, originator_version: int, version: int,
              error: ValidationError) -> ConfigurationError:
    """A stored event its class (after any upcasting) does not validate: the domain's code no longer fits its
    store, most often a field added to an event that gave it no default and no upcaster."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the event"
    if version < cls.class_version:  # the upcasters ran: one of them gave this shape
        advice = (f"The upcasters from class_version {version} to {cls.class_version} (upcast_v{version}_v"
                  f"{version + 1} first) must give a payload the class validates")
    elif first["type"] != "missing":  # the stored value is there, of another shape: the field's type changed
        advice = (f"A field whose type changed needs the class a new class_version and an upcaster that converts "
                  f"the values already stored (upcast_v{cls.class_version}_v{cls.class_version + 1})")
    else:
        advice = (f"A field added to an event class needs a default, or the class a new class_version and an upcaster "
                  f"that fills the field in for the events already stored (upcast_v{cls.class_version}_v"
                  f"{cls.class_version + 1})")
    return ConfigurationError(
        "the domain", f"the {topic} event at version {originator_version} of stream {originator_id}, stored at "
        f"class_version {version}, does not fit {cls.__module__}.{cls.__qualname__} (class_version "
        f"{cls.class_version}): {where}: {first['msg']}. {advice}")


def encode_snapshot(aggregate: Aggregate) -> bytes:
    return _adapter(type(aggregate)).dump_json(aggregate)


def decode_snapshot(cls: type[Aggregate], state: bytes) -> Aggregate:
    return _adapter(cls).validate_json(state)
