"""An ``Amount`` field's bounds (``Annotated[Amount, Field(gt=0, le=..., decimal_places=2)]``, as the scaffold's
refund declares) are in its JSON schema as far as JSON Schema can say them: a value the schema refuses, the parser
refuses too, and every value the parser takes, the schema takes; the bounds a string's pattern cannot hold (a
maximum) are in the description. Before, the schema kept only "an integer or a decimal string", so a generated
client or a fuzzer offered ``"-5"`` and ``"50.005"``, which the server refused."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

import orjson
import pytest
from jsonschema_rs import Draft202012Validator
from pydantic import Field
from pydantic.json_schema import models_json_schema

from commitline import Aggregate, Amount, Command, Domain, Event
from commitline.application.amounts import DECIMAL_TEXT
from commitline.application.commands import parse_command
from commitline.application.errors import InvalidCommand

domain = Domain("refund_bounds")


class RequestRefund(Command):
    amount: Annotated[Amount, Field(gt=0, le=Decimal("1000000"), decimal_places=2)]
    fee: Annotated[Amount, Field(ge=0, decimal_places=0)] = Decimal(0)
    delta: Amount = Decimal(0)


class RefundRequested(Event):
    amount: Decimal


@domain.aggregate
class Refund(Aggregate):
    EVENTS = (RefundRequested,)

    def _evolve(self, event: Event) -> None:
        pass


domain.handles(RequestRefund, Refund)(lambda refund, command: None)  # only parsed here


def parses(body: dict[str, object]) -> bool:
    try:
        parse_command(orjson.dumps({"type": "request_refund", **body}), domain.catalog)
    except InvalidCommand:
        return False
    return True


@pytest.fixture(scope="module")
def schema() -> Draft202012Validator:
    _, schemas = models_json_schema([(RequestRefund, "validation")])
    return Draft202012Validator({**schemas["$defs"]["RequestRefund"], "$defs": schemas["$defs"]})


@pytest.mark.parametrize("amount", ["25.00", 7, "0.01", "0.10", "1.500", "1000000", "1000000.00", 1000000])
def test_an_amount_within_its_bounds_is_taken_by_the_schema_and_the_parser(schema: Draft202012Validator,
                                                                          amount: object) -> None:
    assert parses({"amount": amount}) and schema.is_valid({"type": "request_refund", "amount": amount})


@pytest.mark.parametrize("amount", ["-5", "0", "0.00", "50.005", "0.001", 0, -3, 1000001, 12.5, "1e3"])
def test_an_amount_out_of_its_bounds_is_refused_by_the_schema_and_the_parser(schema: Draft202012Validator,
                                                                            amount: object) -> None:
    assert not parses({"amount": amount}) and not schema.is_valid({"type": "request_refund", "amount": amount})


def test_the_description_states_the_bounds_and_an_unbounded_amount_keeps_its_schema() -> None:
    _, schemas = models_json_schema([(RequestRefund, "validation")])
    properties = schemas["$defs"]["RequestRefund"]["properties"]
    assert properties["amount"]["description"].endswith("above 0, at most 1000000, at most 2 decimal places")
    assert properties["fee"]["anyOf"][0] == {"type": "integer", "minimum": 0}
    assert properties["fee"]["anyOf"][1]["pattern"] == r"^(0|[1-9][0-9]*)(\.0+)?$"
    assert properties["delta"]["anyOf"] == [{"type": "integer"}, {"type": "string", "pattern": DECIMAL_TEXT}]
    assert not parses({"amount": "1", "fee": "-1"}) and not parses({"amount": "1", "fee": "0.5"})
    assert parses({"amount": "1", "fee": "3", "delta": "-2.125"})
