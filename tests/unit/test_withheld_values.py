"""Messages about an event never repeat its personal values: ``withheld`` puts ``<personal FIELD>`` in their place
(as written and as their ``repr``, longest first), ``error_text`` tells an error that way, a pydantic validation
error without its inputs; ``InvalidPersonalValue`` names the field and the reason, never the value."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated
from uuid import uuid4

import pytest
from pydantic import BaseModel, ValidationError

from commitline import ERASED, Event, Personal
from commitline.domain.errors import InvalidPersonalValue
from commitline.domain.personal import error_text, personal_names, personal_values, withheld
from tests.domains.careless import Contact


class Registered(Event):
    who: str
    email: Annotated[str, Personal(subject="who")]
    phones: Annotated[list[str], Personal(subject="who")]


def test_every_written_form_of_a_value_is_withheld_the_longest_first() -> None:
    values = {"email": "ann@x.test", "phones": ["+33 1", "ann@x.test-2"], "address": "1 Main St\nParis"}
    text = withheld(f"ann@x.test-2 and ann@x.test; [+33 1]; {values['address']!r}", values)
    assert text == "<personal phones> and <personal email>; [<personal phones>]; '<personal address>'"


def test_an_events_plain_personal_values_not_the_erased_ones() -> None:
    e = Registered(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                   who="c-1", email=ERASED, phones=["+33 1"])
    assert personal_values(e) == {"phones": ["+33 1"]}
    assert personal_names(Contact) == frozenset({"email"})


def test_a_validation_error_is_told_without_its_inputs() -> None:
    class Shape(BaseModel):
        size: int

    with pytest.raises(ValidationError) as raised:
        Shape(size="SECRET-SIZE")
    assert "SECRET-SIZE" in str(raised.value)  # pydantic's own text quotes it
    told = error_text(raised.value, {})
    assert told.startswith("ValidationError: 1 validation error(s) for Shape: size: Input should be a valid integer")
    assert "SECRET-SIZE" not in told


def test_an_error_quoting_a_value_is_told_without_it() -> None:
    assert error_text(KeyError("ann@x.test"), {"email": "ann@x.test"}) == "KeyError: '<personal email>'"


def test_an_invalid_personal_value_names_the_field_and_the_reason_only() -> None:
    error = InvalidPersonalValue("email", "is on the blocked list")
    assert error.code == "invalid_value"
    assert str(error) == "email: is on the blocked list (a personal value: not shown)"
    assert error.details() == {"field": "email", "value": None, "reason": "is on the blocked list"}
