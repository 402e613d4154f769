"""Money never passes through a binary float unnoticed. A command field declared ``Decimal`` (not only
``Amount``), in the command or in a model it holds at any depth, refuses a JSON number with a fraction or an
exponent, and a string an ``Amount`` would refuse (``"1e3"``, ``" 2.5"``), naming where, and the OpenAPI
description says so; an aggregate that emits a float into an event's ``Decimal`` field fails at that line, and nothing of
the command is kept."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import NewType
from uuid import uuid4

import orjson
import pytest
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from commitline import Aggregate, Command, Domain, Event
from commitline.application.amounts import DECIMAL_TEXT
from commitline.application.commands import Amount, parse_command
from commitline.application.errors import InvalidCommand
from commitline.http.openapi import _decimals_as_text

Price = NewType("Price", Decimal)


class PlacePrice(Command):
    price: Decimal
    limit: Decimal | None = None
    legs: list[Decimal] = []
    amount: Amount = Decimal(1)
    weight: float = 0.0


domain = Domain("pricing")


class Priced(Event):
    price: Decimal
    history: tuple[Decimal, ...] = ()
    tick: Price | None = None
    ratio: float = 0.0


@domain.aggregate
class Quote(Aggregate):
    EVENTS = (Priced,)
    price: Decimal = Decimal(0)

    def price_at(self, **payload: object) -> None:
        self._emit(Priced, **payload)

    def _evolve(self, event: Event) -> None:
        match event:
            case Priced(price=price):
                self.price = price


domain.handles(PlacePrice, Quote)(lambda quote, command: quote.price_at(price=command.price))


class Leg(BaseModel):
    price: Decimal
    note: float = 0.0
    amount: Amount = Decimal(1)


class Basket(BaseModel):
    legs: list[Leg]
    fee: Decimal | None = None


class Node(BaseModel):
    price: Decimal
    children: list[Node] = []


class PlaceBasket(Command):
    basket: Basket
    by_venue: dict[str, Leg] = {}
    tree: Node | None = None
    pair: tuple[Decimal, float] | None = None
    code: Decimal | str | None = None


domain.handles(PlaceBasket, Quote)(lambda quote, command: quote.price_at(price=command.basket.legs[0].price))


def parsed(body: dict[str, object] | str) -> PlacePrice:
    text = f'{{"type": "place_price", {body}}}' if isinstance(body, str) else orjson.dumps({"type": "place_price", **body})
    return parse_command(text, domain.catalog)  # type: ignore[return-value]


@pytest.mark.parametrize(("body", "loc"), [
    ('"price": 1.0000000000000000001', ["price"]),  # JSON text: a float would round it before it is sent
    ({"price": 1e30}, ["price"]),
    ({"price": "1.5", "limit": 0.1}, ["limit"]),
    ({"price": "1.5", "legs": ["1", 0.25]}, ["legs", 1]),
])
def test_a_decimal_command_field_refuses_a_binary_float_naming_where(body: dict[str, object] | str, loc: list[object]
                                                                      ) -> None:
    with pytest.raises(InvalidCommand) as refused:
        parsed(body)
    (problem,) = refused.value.errors
    assert problem["loc"] == loc and problem["type"] == "decimal_type"
    assert "never a binary float" in problem["msg"]


@pytest.mark.parametrize(("body", "loc"), [
    ({"basket": {"legs": [{"price": "1"}, {"price": 0.1}]}}, ["basket", "legs", 1, "price"]),
    ({"basket": {"legs": [], "fee": 0.5}}, ["basket", "fee"]),
    ({"basket": {"legs": []}, "by_venue": {"xlon": {"price": 2.5}}}, ["by_venue", "xlon", "price"]),
    ({"basket": {"legs": []}, "tree": {"price": "1", "children": [{"price": "2", "children": [{"price": 0.3}]}]}},
     ["tree", "children", 0, "children", 0, "price"]),
    ({"basket": {"legs": []}, "pair": [0.5, 0.5]}, ["pair", 0]),
])
def test_a_decimal_field_of_a_model_a_command_holds_refuses_a_binary_float_naming_where(
        body: dict[str, object], loc: list[object]) -> None:
    with pytest.raises(InvalidCommand) as refused:
        parse_command(orjson.dumps({"type": "place_basket", **body}), domain.catalog)
    (problem,) = refused.value.errors
    assert problem["loc"] == loc and problem["type"] == "decimal_type"
    with pytest.raises(InvalidCommand) as refused:  # a mapping built in Python is read the same way
        parse_command({"type": "place_basket", **body}, domain.catalog)
    assert [p["loc"] for p in refused.value.errors] == [loc]


@pytest.mark.parametrize("text", ["1e3", " 2.5", "2.5 ", "1_000", "01.5", "+1", ".5", "1.", "NaN", "12.50\n"])
@pytest.mark.parametrize(("body", "loc"), [
    (lambda t: {"basket": {"legs": [{"price": "1"}, {"price": t}]}}, ["basket", "legs", 1, "price"]),
    (lambda t: {"basket": {"legs": []}, "tree": {"price": "1", "children": [{"price": t}]}},
     ["tree", "children", 0, "price"]),
    (lambda t: {"basket": {"legs": []}, "pair": [t, 0.5]}, ["pair", 0]),
])
def test_a_decimal_field_refuses_text_an_amount_would_refuse_naming_where(text: str, body, loc: list[object]
                                                                          ) -> None:
    with pytest.raises(InvalidCommand) as refused:
        parse_command(orjson.dumps({"type": "place_basket", **body(text)}), domain.catalog)
    (problem,) = refused.value.errors
    assert problem["loc"] == loc and problem["type"] == "decimal_parsing", problem
    assert "no exponent, white space, underscores or leading zeros" in problem["msg"]
    with pytest.raises(InvalidCommand, match="decimal_parsing|no exponent"):  # a command's own field too
        parsed({"price": text})


def test_a_field_that_also_takes_text_keeps_taking_any_text() -> None:
    base = {"type": "place_basket", "basket": {"legs": []}}
    assert parse_command(orjson.dumps({**base, "code": "XLON-1"}), domain.catalog).code == "XLON-1"
    assert parse_command(orjson.dumps({**base, "code": 5}), domain.catalog).code == Decimal(5)


def test_a_nested_model_takes_exact_decimals_and_keeps_its_float_fields() -> None:
    body = {"type": "place_basket", "basket": {"legs": [{"price": "0.1", "note": 0.5}], "fee": 3},
            "tree": {"price": "1.0000000000000000001", "children": [{"price": 2}]}, "pair": ["0.3", 0.3]}
    command = parse_command(orjson.dumps(body), domain.catalog)
    assert isinstance(command, PlaceBasket)
    assert command.basket.legs[0].price == Decimal("0.1") and command.basket.legs[0].note == 0.5
    assert command.tree is not None and command.tree.price == Decimal("1.0000000000000000001")
    assert command.tree.children[0].price == Decimal(2) and command.pair == (Decimal("0.3"), 0.3)
    with pytest.raises(InvalidCommand, match="never a binary float"):  # a nested Amount keeps its own refusal
        parse_command(orjson.dumps({**body, "basket": {"legs": [{"price": "1", "amount": 2.5}]}}), domain.catalog)


def test_a_decimal_command_field_takes_strings_and_integers_exactly_and_other_fields_keep_their_types() -> None:
    command = parsed({"price": "1.0000000000000000001", "limit": 7, "legs": ["0.1", 2], "weight": 0.5})
    assert command.price == Decimal("1.0000000000000000001") and command.limit == Decimal(7)
    assert command.legs == [Decimal("0.1"), Decimal(2)] and command.weight == 0.5
    with pytest.raises(InvalidCommand, match="never a binary float") as refused:  # Amount keeps its own refusal
        parsed({"price": "1", "amount": 2.5})
    (problem,) = refused.value.errors
    assert problem["msg"].startswith("amounts must be given"), problem  # the validator's words, no pydantic prefix


def test_the_description_offers_a_decimal_field_integers_and_strings_only() -> None:
    _, schemas = models_json_schema([(PlacePrice, "validation"), (PlaceBasket, "validation")])
    defs = schemas["$defs"]
    _decimals_as_text(defs, [PlacePrice, PlaceBasket])
    schema = defs["PlacePrice"]
    text = orjson.dumps({k: schema["properties"][k] for k in ("price", "limit", "legs")}).decode()
    assert '"number"' not in text and '"integer"' in text
    assert schema["properties"]["weight"]["type"] == "number"  # a float field stays one
    nested = orjson.dumps([defs["Leg"]["properties"]["price"], defs["Basket"]["properties"]["fee"],
                           defs["Node"]["properties"]["price"]]).decode()
    assert '"number"' not in nested and '"integer"' in nested
    assert nested.count('"pattern"') == 3 and orjson.dumps(DECIMAL_TEXT).decode() in nested
    assert defs["Leg"]["properties"]["note"]["type"] == "number"
    pair = defs["PlaceBasket"]["properties"]["pair"]
    assert orjson.dumps(pair).decode().count('"pattern"') == 1  # the decimal's string, not the float beside it


@pytest.mark.parametrize(("payload", "field"), [
    ({"price": 0.1 * 3}, "Priced.price"),
    ({"price": Decimal("0.3"), "history": (Decimal(1), 0.5)}, "Priced.history"),
    ({"price": Decimal("0.3"), "tick": 0.3}, "Priced.tick"),
])
def test_an_event_emitted_with_a_float_in_a_decimal_field_fails_and_nothing_is_kept(payload: dict[str, object],
                                                                                    field: str) -> None:
    quote = Quote.blank(uuid4())
    with pytest.raises(TypeError, match=rf"^{field} is a Decimal field, emitted with the binary float"):
        quote.price_at(**payload)
    assert quote.version == 0 and quote.price == 0 and not quote.collect_events()


def test_an_event_takes_decimals_integers_and_floats_where_declared_float() -> None:
    quote = Quote.blank(uuid4())
    quote.price_at(price=Decimal("0.3"), history=(Decimal(1), 2), tick=Price(Decimal("0.1")), ratio=0.5)
    (event,) = quote.collect_events()
    assert event.price == Decimal("0.3") and event.ratio == 0.5


def _release(price_type: type) -> tuple[type[Event], Domain]:
    """A release whose ``Repriced`` declares ``price`` as ``price_type``; both releases store the same type name."""
    release = Domain(f"pricing_{price_type.__name__.lower()}")
    repriced = type("Repriced", (Event,), {"__annotations__": {"price": price_type, "seen": "int | None"},
                                           "seen": None, "__module__": __name__})

    @release.aggregate
    class Board(Aggregate):
        EVENTS = (repriced,)

        def _evolve(self, event: Event) -> None:
            pass

    return repriced, release


@pytest.mark.parametrize(("now", "stored", "declared"), [(float, "10.05", "float"), (int, "10", "int")])
def test_a_stored_decimal_read_by_a_release_that_declares_the_field_a_number_is_refused_naming_it(
        now: type, stored: str, declared: str) -> None:
    """A Decimal is stored as text; read as it is by a class that now says float (or int), it would become 10.05
    (or 10) without a word. JSON stores numbers as numbers, so text there means the type changed."""
    from commitline.application.errors import ConfigurationError
    from commitline.infrastructure.store.codec import EventCodec, encode_event

    old, _ = _release(Decimal)
    new, release = _release(now)
    event = old(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                price=Decimal(stored), seen=3)
    record = encode_event(event, "acme")
    with pytest.raises(ConfigurationError) as refused:
        EventCodec(release.check().registry).decode_event(record.topic, record.originator_id, 1, record.state)
    message = str(refused.value)
    assert f"price is stored as the text '{stored}', and the class declares it {declared}" in message
    assert "the field's type changed" in message and "upcast_v1_v2" in message
    same = EventCodec(_release(Decimal)[1].check().registry)  # the release that wrote it reads it as it was
    assert same.decode_event(record.topic, record.originator_id, 1, record.state).event.price == Decimal(stored)


@dataclass(frozen=True)
class Posting:
    account: str
    amount: Decimal
    rate: float = 0.0


class Split(Event):
    legs: list[Posting]
    ratio: float = 0.0
    extra: dict[str, object] | None = None


@domain.aggregate
class Ledger(Aggregate):
    EVENTS = (Split,)

    def split(self, **payload: object) -> None:
        self._emit(Split, **payload)

    def _evolve(self, event: Event) -> None:
        pass


@pytest.mark.parametrize(("payload", "refusal", "message"), [
    ({"legs": [Posting("m", Decimal("0.2")), Posting("fee", 0.1 + 0.2)]}, TypeError,  # type: ignore[arg-type]
     r"^Split\.legs\.amount is a Decimal field, emitted with the binary float 0\.30000000000000004"),
    ({"legs": [], "ratio": float("inf")}, ValueError, r"^Split\.ratio was emitted with inf, which is not a finite"),
    ({"legs": [Posting("a", Decimal(1), float("nan"))]}, ValueError, r"^Split\.legs\.rate was emitted with nan"),
    ({"legs": [], "extra": {"x": [1, float("-inf")]}}, ValueError, r"^Split\.extra was emitted with -inf"),
    ({"legs": [Posting("a", Decimal("NaN"))]}, ValueError, r"^Split\.legs\.amount was emitted with Decimal\('NaN'\)"),
], ids=["float-in-nested-decimal", "infinite-float", "nan-in-nested-float", "infinity-in-any", "decimal-nan"])
def test_a_number_json_cannot_store_exactly_is_refused_at_any_depth_and_nothing_is_kept(
        payload: dict[str, object], refusal: type[Exception], message: str) -> None:
    """A NaN or an infinity was stored as null, and no load could read the stream back again; a float in a Decimal
    inside a dataclass was stored as its binary digits."""
    ledger = Ledger.blank(uuid4())
    with pytest.raises(refusal, match=message):
        ledger.split(**payload)
    assert ledger.version == 0 and not ledger.collect_events()


def test_finite_floats_and_decimals_in_nested_fields_are_taken() -> None:
    ledger = Ledger.blank(uuid4())
    ledger.split(legs=[Posting("a", Decimal("1.5"), 0.5)], ratio=0.25, extra={"x": 0.5, "y": [Decimal(2)]})
    (event,) = ledger.collect_events()
    assert event.legs[0].amount == Decimal("1.5") and event.ratio == 0.25


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), float("-inf")])
def test_a_command_given_a_nan_or_an_infinity_in_python_is_invalid_naming_the_field(weight: float) -> None:
    with pytest.raises(InvalidCommand) as refused:  # JSON cannot carry one; a Python caller can
        parse_command({"type": "place_price", "price": "1", "weight": weight}, domain.catalog)
    assert [e["loc"] for e in refused.value.errors] == [["weight"]]
