"""The answer an idempotency record stands for, read back from the events it refers to.

Since migration 14 a key's record holds no copy of its command's answer: it refers to the command's events (the
last ``event_count`` versions of its stream up to ``stream_version``), which are immutable, and keeps what they do
not hold (the command type; the aggregate type of a command that recorded none). ``answer`` rebuilds the
``DispatchResult`` from those stored events as the first answer showed it, byte for byte: each payload is the
stored ``data`` (the JSON form the first answer was given in: ``application/results.payload_json``), its personal
fields opened (an erased subject's as ``{"erased": true}``), never upcast; the event's id, time and tenant are the
stored ones. A record whose events are not all there, as its stream's version range, in its tenant, readable,
raises ``IdempotencyRecordBroken``: nothing is invented in their place.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson

from commitline.application.ports import IdempotencyRecord, IdempotencyRecordBroken
from commitline.application.results import DispatchResult, RecordedEventView, result, view
from commitline.domain.personal import ERASED_JSON, Erased
from commitline.infrastructure.store.codec import EventCodec


def first_version(record: IdempotencyRecord) -> int:
    """The version before the record's first event (its stream's version before the command)."""
    return record.stream_version - (record.event_count or 0)


def answer(record: IdempotencyRecord, rows: Sequence[tuple[int, str, bytes]], codec: EventCodec) -> DispatchResult:
    """The record's answer (``replayed``) from ``rows``, the stored (version, topic, state) of the events it refers
    to, as ``command_events`` reads them."""
    def broken(reason: str) -> IdempotencyRecordBroken:
        return IdempotencyRecordBroken(record.tenant, record.key, reason)

    count = record.event_count
    if count is None or count < 0:
        raise broken("it holds neither an outcome nor a reference to its command's events")
    after = first_version(record)
    if [v for v, _, _ in rows] != list(range(after + 1, record.stream_version + 1)):
        raise broken(f"it refers to versions {after + 1} to {record.stream_version} of stream {record.aggregate_id}, "
                     f"and {len(rows)} of them are stored")
    try:
        states = [orjson.loads(state) for _, _, state in rows]
    except orjson.JSONDecodeError:
        raise broken(f"an event of stream {record.aggregate_id} it refers to is not readable JSON") from None
    if any(s.get("tenant") != record.tenant for s in states):
        raise broken(f"an event of stream {record.aggregate_id} it refers to is not its tenant's")
    aggregate_type = record.aggregate_type
    if aggregate_type is None:
        if not rows:
            raise broken("it names no aggregate type for a command without events")
        try:
            aggregate_type = codec.registry.aggregate_name_of(rows[0][1])
        except LookupError as e:
            raise broken(str(e)) from None
    if any(b'"pd":' in state for _, _, state in rows):
        codec.preload_keys(state for _, _, state in rows)
    try:
        events = tuple(_view(record, version, topic, state, aggregate_type, codec)
                       for (version, topic, _), state in zip(rows, states, strict=True))
    except (KeyError, TypeError, ValueError) as e:
        raise broken(f"an event of stream {record.aggregate_id} it refers to is not readable: {e!r}") from None
    return result(record.command_type, record.tenant, aggregate_type, record.aggregate_id, record.stream_version,
                  events, replayed=True)


def _view(record: IdempotencyRecord, version: int, topic: str, state: dict[str, Any], aggregate_type: str,
          codec: EventCodec) -> RecordedEventView:
    payload = state["data"]
    if "pd" in state:
        payload = {name: dict(ERASED_JSON) if isinstance(value, Erased) else value
                   for name, value in codec.opened(state).items()}
    if not isinstance(payload, dict):
        raise TypeError("its data is not an object")
    return view(UUID(state["id"]), topic, aggregate_type, record.aggregate_id, version,
                datetime.fromisoformat(state["at"]), state["tenant"], payload)
