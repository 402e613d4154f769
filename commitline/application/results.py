"""What ``dispatch`` returns: the changed stream, its new version and the events recorded.

An event's ``payload`` is shown as the store holds it (``payload_json``: the stored event's JSON rules, keys
sorted), so a replay, which reads the command's stored events back, answers the same JSON byte for byte, whatever
the event classes became since (their upcasters are not applied). A result is built once, from values already
valid (``result``, ``view``: no validation), and serialised once, for the answer (``outcome_bytes``).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson
from pydantic import BaseModel, ConfigDict

from commitline.application.errors import EventNotStorable
from commitline.domain.personal import ERASED_JSON, Erased

#: The bytes of a request's fingerprint an idempotency record keeps (a SHA-256 prefix: 128 bits tell two requests
#: under one tenant's key apart). Records from before migration 14 keep all 32.
FINGERPRINT_BYTES = 16


class RecordedEventView(BaseModel):
    model_config = ConfigDict(frozen=True)

    event_id: UUID
    type: str
    aggregate_type: str
    aggregate_id: UUID
    version: int
    occurred_at: datetime
    tenant: str
    payload: dict[str, Any]


class DispatchResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    command_type: str
    tenant: str
    aggregate_type: str
    aggregate_id: UUID
    version: int
    events: tuple[RecordedEventView, ...]
    replayed: bool = False

    def outcome_bytes(self) -> bytes:
        return self.model_dump_json(exclude={"replayed"}).encode()

    @classmethod
    def from_outcome(cls, outcome: bytes) -> DispatchResult:
        """The answer an idempotency record from before migration 14 holds (its stored JSON), replayed."""
        return cls.model_validate_json(outcome).model_copy(update={"replayed": True})


_new = object.__new__
_set = object.__setattr__
_VIEW_FIELDS = frozenset(RecordedEventView.model_fields)
_RESULT_FIELDS = frozenset(DispatchResult.model_fields)


def _built(cls: type[BaseModel], values: dict[str, Any], fields: frozenset[str]) -> Any:
    """An instance of ``cls`` holding ``values`` (every field, of its type), as ``model_construct`` makes one
    (the same attributes), without its per-field Python loop: several times cheaper than validating again."""
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(fields))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


def view(event_id: UUID, type: str, aggregate_type: str, aggregate_id: UUID, version: int, occurred_at: datetime,
         tenant: str, payload: dict[str, Any]) -> RecordedEventView:
    """One event of a result, from values of the field types (not validated again)."""
    return _built(RecordedEventView, {"event_id": event_id, "type": type, "aggregate_type": aggregate_type,
                                      "aggregate_id": aggregate_id, "version": version, "occurred_at": occurred_at,
                                      "tenant": tenant, "payload": payload}, _VIEW_FIELDS)


def result(command_type: str, tenant: str, aggregate_type: str, aggregate_id: UUID, version: int,
           events: tuple[RecordedEventView, ...], replayed: bool = False) -> DispatchResult:
    """A result from values of the field types (not validated again)."""
    return _built(DispatchResult, {"command_type": command_type, "tenant": tenant, "aggregate_type": aggregate_type,
                                   "aggregate_id": aggregate_id, "version": version, "events": events,
                                   "replayed": replayed}, _RESULT_FIELDS)


def json_default(value: Any) -> Any:
    """How a value orjson does not know is stored in an event's JSON (``infrastructure/store/codec.dumps``), and
    so how a payload reads back: decimals as strings in plain notation (``0.00000001``, never ``1E-8``: what an
    ``Amount`` accepts back), sets sorted, an erased value as its marker."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Erased):
        return ERASED_JSON
    raise TypeError(f"cannot encode {type(value).__name__}")


def unstorable(command_type: str, events: Any) -> EventNotStorable | None:
    """The refusal naming the first of ``events`` (domain events) with a field whose value the store's JSON cannot
    hold (an integer beyond 64 bits, bytes, an object of no JSON form), None if there is none. Only called once an
    encoding failed: it encodes each field again, alone."""
    for event in events:
        for name, value in event.payload().items():
            try:
                orjson.dumps(value, default=json_default)
            except orjson.JSONEncodeError as e:
                return EventNotStorable(command_type, event.type_name(), name, str(e))
    return None


def payload_json(payload: dict[str, Any]) -> dict[str, Any]:
    """An event's payload as its stored event holds it (before any personal field is sealed), read back: plain
    JSON values, keys sorted, Decimals as strings, UUIDs and datetimes as ISO 8601 text, sets as sorted lists."""
    return orjson.loads(orjson.dumps(payload, default=json_default, option=orjson.OPT_SORT_KEYS))
