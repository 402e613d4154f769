"""Idempotency records' stored outcomes without personal plain text: the records stored before migration 14, which
hold a copy of their answer (a record stored since refers to its command's events instead: ``store/replays.py``).

A command's outcome (``DispatchResult``'s JSON: its events with their payloads) is stored to be replayed on a
retry. Before it is stored, each personal field of its events is replaced by the very form the stored event
holds (``protect``: the same ciphertext, which opens with the same associated data, since the event id,
field and tenant are the same) and the event's view lists them under ``"pd"``; a replay opens them again
(``reveal``), an erased one as ``{"erased": true}``. The revealed JSON is equal, value for value, to the outcome
as it was first answered, so the replayed ``DispatchResult`` is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from eventsourcing.persistence import StoredEvent

from commitline.application.errors import ConfigurationError
from commitline.domain.personal import ERASED_JSON, Erased
from commitline.infrastructure.personal.cipher import PersonalData

_MARK = b'"pd":'


def protect(outcome: bytes, stored: Sequence[StoredEvent]) -> bytes:
    """``outcome`` with its events' personal fields as ``stored`` holds them; as it is when they have none."""
    sealed: dict[str, dict[str, Any]] = {}
    for event in stored:
        if _MARK in event.state:
            state = orjson.loads(event.state)
            if "pd" in state:
                sealed[state["id"]] = {name: state["data"][name] for name in state["pd"]}
    if not sealed:
        return outcome
    result = orjson.loads(outcome)
    for view in result.get("events", ()):
        fields = sealed.get(view.get("event_id"))
        if fields:
            view["payload"].update(fields)
            view["pd"] = list(fields)
    return orjson.dumps(result)


def reveal(outcome: bytes, personal: PersonalData | None) -> bytes:
    """A stored outcome with its personal fields opened (erased ones as ``{"erased": true}``)."""
    if _MARK not in outcome:
        return outcome
    result = orjson.loads(outcome)
    for view in result.get("events", ()):
        fields = view.pop("pd", None)
        if not fields:
            continue
        if personal is None:
            raise ConfigurationError("COMMITLINE_MASTER_KEY", "a stored outcome holds personal fields, and this "
                                     "store has no key for them")
        payload = view["payload"]
        for name in fields:
            value = personal.open(view["tenant"], view["event_id"], name, payload[name])
            payload[name] = dict(ERASED_JSON) if isinstance(value, Erased) else value
    return orjson.dumps(result)
