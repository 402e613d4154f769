"""An answer's payload is its stored event's JSON read back (``results.payload_json`` is ``codec.dumps``'s rules),
so a replay, which reads the stored event, answers the same bytes: checked on values of every type the rules
name, and shown to fail where the pydantic JSON form of the same values differs."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum
from uuid import UUID

import orjson
from pydantic_core import to_jsonable_python

from commitline.application.results import payload_json
from commitline.domain.personal import ERASED
from commitline.infrastructure.store.codec import dumps


class Colour(str, Enum):
    RED = "RED"


PAYLOAD = {
    "zeta": Decimal("12.50"), "amount": Decimal("1E+3"), "id": UUID("0b7e5a0c-2f4e-4f8e-9d61-6a1f3c2b9e77"),
    "at": datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=timezone.utc),
    "local": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))),
    "tags": frozenset({"b", "a", "c"}), "users": ("u2", "u1"), "colour": Colour.RED, "none": None, "n": 3,
    "x": 0.1, "nested": {"b": 1, "a": [Decimal("2.0")]}, "gone": ERASED, "text": "Ünïcode \u2603",
}


def test_the_answers_payload_is_the_stored_payload_read_back() -> None:
    shown = payload_json(dict(PAYLOAD))
    assert shown == orjson.loads(dumps(dict(PAYLOAD)))
    assert orjson.dumps(shown) == dumps(dict(PAYLOAD))  # same keys in the same order, same texts
    assert list(shown) == sorted(PAYLOAD)
    assert shown["gone"] == {"erased": True} and shown["tags"] == ["a", "b", "c"]


def test_the_pydantic_form_would_not_be_the_stored_one() -> None:
    pydantic_form = to_jsonable_python({k: v for k, v in PAYLOAD.items() if k != "gone"})
    stored = orjson.loads(dumps({k: v for k, v in PAYLOAD.items() if k != "gone"}))
    assert orjson.dumps(pydantic_form) != orjson.dumps(stored)  # what a replay from the events could not match


def test_a_decimal_is_stored_in_the_notation_an_amount_accepts_back() -> None:
    from commitline.application.commands import DECIMAL_TEXT

    payload = payload_json({"tiny": Decimal("1E-8"), "scaled": Decimal("1.0E-7"), "big": Decimal("1E+3"),
                            "plain": Decimal("12.50"), "negative": Decimal("-0.5")})
    assert payload == {"big": "1000", "negative": "-0.5", "plain": "12.50", "scaled": "0.00000010",
                       "tiny": "0.00000001"}
    assert all(re.fullmatch(DECIMAL_TEXT.strip("^$"), value) for value in payload.values())
