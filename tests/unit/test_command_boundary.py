"""The command boundary: only JSON values within the limits, from every entry, refused with a typed
error naming each problem's location, before the store is touched.

``BAD_INPUTS`` and ``assert_refused`` are shared with tests/integration/test_bad_input.py, which sends
the same table through a real store and the CLI.
"""

from __future__ import annotations

import json
from datetime import date, datetime, time, timezone
from decimal import Decimal
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from commitline.application import errors as E
from commitline.application.boundary import DEFAULT_LIMITS, CommandLimits, check_idempotency_key, check_tenant
from commitline.application.commands import Amount, Command, Text
from commitline.application.commands import parse_command as parse_for
from tests.support import COMMAND_TYPES, EXAMPLES, parse_command
from commitline.examples.payments import CreatePayment
from commitline.examples.surveys import CreateSurveyTask, IssueSurveyTask
from commitline.application.errors import printable
from commitline.application.processor import CommandProcessor
from commitline.infrastructure.config import load_settings

ITEM = "5f0c1c1e-0000-4000-8000-000000000001"
PAYMENT = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-1"}
TASK = {"type": "create_survey_task", "title": "t"}
STOCK = {"type": "receive_stock", "item_id": ITEM, "quantity": 1}
ISSUE = {"type": "issue_survey_task", "task_id": ITEM, "user_ids": ["u1"]}
LIMITS = DEFAULT_LIMITS


def nested(depth: int, leaf: Any = "x") -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def self_referential() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["a"] = loop
    return loop


def payment_text(amount: str) -> str:
    return '{"type": "create_payment", "amount": %s, "currency": "EUR", "account": "a"}' % amount


def task_text(title: str) -> str:
    return '{"type": "create_survey_task", "title": %s}' % title


TOO_DEEP = ["title", *[0] * (LIMITS.max_depth - 1)]  # the first list nested beyond the limit
IC, KEY, TENANT = E.InvalidCommand, E.InvalidIdempotencyKey, E.InvalidTenant


def case(name: str, command: Any, loc: list | None, error: type[E.CommitlineError] = IC, *, key: Any = "k",
         tenant: Any = "default") -> Any:
    return pytest.param(command, key, tenant, error, loc, id=name)


BAD_INPUTS = [
    # integers, amounts and quantities beyond what the domain and storage support
    case("int amount beyond 64 bits", {**PAYMENT, "amount": 10**20}, ["amount"]),
    case("int amount at the maximum", {**PAYMENT, "amount": 10**15}, ["amount"]),
    case("decimal string amount beyond the maximum", {**PAYMENT, "amount": "1e15"}, ["amount"]),
    case("amount with a huge exponent", {**PAYMENT, "amount": "1e100000"}, ["amount"]),
    case("too many decimals without a minor unit", {**PAYMENT, "currency": "XAU", "amount": "1.123456789"},
         ["amount"]),
    case("quantity beyond 64 bits", {**STOCK, "quantity": 10**30}, ["quantity"]),
    case("quantity beyond the maximum", {**STOCK, "quantity": 10**12 + 1}, ["quantity"]),
    case("negative int beyond 64 bits", {**STOCK, "expected_version": -(2**63) - 1}, ["expected_version"]),
    case("float amount", {**PAYMENT, "amount": 12.5}, ["amount"]),
    case("NaN float", {**PAYMENT, "amount": float("nan")}, ["amount"]),
    case("infinite float", {**STOCK, "quantity": float("inf")}, ["quantity"]),
    # fields and types
    case("unknown field", {**TASK, "surprise": 1}, ["surprise"]),
    case("unknown type", {"type": "teleport_money"}, None, E.UnknownCommandType),
    case("no type", {"title": "t"}, None, E.UnknownCommandType),
    case("int currency", {**PAYMENT, "currency": 978}, ["currency"]),
    case("string quantity", {**STOCK, "quantity": "5"}, ["quantity"]),
    case("string where a list goes", {**ISSUE, "user_ids": "u1"}, ["user_ids"]),
    case("bool quantity", {**STOCK, "quantity": True}, ["quantity"]),
    case("bool expected_version", {**STOCK, "expected_version": False}, ["expected_version"]),
    # Python objects that are not JSON: refused, never str()-ed
    case("set", {**PAYMENT, "account": {"a", "b"}}, ["account"]),
    case("bytes", {**PAYMENT, "account": b"acc-1"}, ["account"]),
    case("object", {**PAYMENT, "account": object()}, ["account"]),
    case("UUID outside an id field", {**PAYMENT, "account": UUID(ITEM)}, ["account"]),
    case("Decimal outside an amount", {**STOCK, "quantity": Decimal(5)}, ["quantity"]),
    case("non-string key", {**TASK, 1: "x"}, ["1"]),
    case("None as a key", {**TASK, None: "x"}, ["None"]),
    # text PostgreSQL cannot store, and text too long
    case("lone surrogate in a value", {**TASK, "title": "t\udfff"}, ["title"]),
    case("lone surrogate in a field name", {**TASK, "x\udfff": 1}, [printable("x\udfff")]),
    case("lone surrogate in the type", {**TASK, "type": "create_survey_task\udfff"}, ["type"]),
    case("NUL in a string", {**TASK, "title": "a\x00b"}, ["title"]),
    case("NUL in a list item", {**ISSUE, "user_ids": ["u1", "u\x00"]}, ["user_ids", 1]),
    case("overlong string", {**TASK, "title": "x" * (LIMITS.max_string_length + 1)}, ["title"]),
    case("overlong list", {**ISSUE, "user_ids": ["u"] * (LIMITS.max_list_length + 1)}, ["user_ids"]),
    # nesting and shape
    case("deep nesting as a mapping", {**TASK, "title": nested(1000)}, TOO_DEEP),
    case("self-referential mapping", {**TASK, "x": self_referential()}, ["x", *["a"] * (LIMITS.max_depth - 1)]),
    case("a list, not a mapping", ["type", "create_survey_task"], []),
    case("None", None, []),
    # JSON text and bytes
    case("NaN in JSON", payment_text("NaN"), ["amount"]),
    case("Infinity in JSON", payment_text("Infinity"), ["amount"]),
    case("-Infinity in JSON", payment_text("-Infinity"), ["amount"]),
    case("1e400 in JSON", payment_text("1e400"), ["amount"]),
    # a JSON number is what its digits say, not the float they round to: none of these is a whole number
    case("just below 1 in JSON", payment_text("0.9999999999999999999"), ["amount"]),
    case("just below 10^14 in JSON", payment_text("99999999999999.999"), ["amount"]),
    case("just above 100 in JSON", payment_text("100.000000000000000000001"), ["amount"]),
    case("below the smallest float in JSON", payment_text("1e-400"), ["amount"]),
    case("a fraction of a unit in JSON", '{"type": "receive_stock", "item_id": "%s", "quantity": 0.99999999999999999}'
         % ITEM, ["quantity"]),
    case("a fraction of a version in JSON", '{"type": "submit_payment", "payment_id": "%s", '
         '"expected_version": 1.00000000000000001}' % ITEM, ["expected_version"]),
    case("huge integer in JSON", payment_text("100000000000000000000"), ["amount"]),
    case("integer just beyond 64 bits in JSON", payment_text("9223372036854775808"), ["amount"]),
    case("deep nesting as JSON text", task_text("[" * 50 + "]" * 50), TOO_DEEP),
    case("nesting beyond the JSON reader", task_text("[" * 100_000), []),
    case("oversized JSON text", task_text('"' + "x" * LIMITS.max_bytes + '"'), []),
    case("key given twice", '{"type": "create_survey_task", "title": "a", "title": "b"}', ["title"]),
    case("NUL escape in JSON", task_text('"a\\u0000"'), ["title"]),
    case("lone surrogate escape in JSON", task_text('"t\\udfff"'), ["title"]),
    case("JSON array", "[1, 2]", []),
    case("JSON number", "5", []),
    case("not JSON", "{nope", []),
    case("invalid UTF-8 in a string", b'{"type": "create_survey_task", "title": "t\xff"}', ["title"]),
    case("invalid UTF-8 outside strings", b'\xff{"type": "create_survey_task", "title": "t"}', []),
    case("UTF-16", json.dumps(TASK).encode("utf-16"), []),
    # the idempotency key and the tenant
    case("no key", TASK, None, E.MissingIdempotencyKey, key=None),
    case("empty key", TASK, None, KEY, key=""),
    case("blank key", TASK, None, KEY, key="   "),
    case("overlong key", TASK, None, KEY, key="x" * 256),
    case("lone surrogate in the key", TASK, None, KEY, key="k\udfff"),
    case("NUL in the key", TASK, None, KEY, key="k\x00"),
    case("newline in the key", TASK, None, KEY, key="k\n"),
    case("int key", TASK, None, KEY, key=5),
    case("bytes key", TASK, None, KEY, key=b"k"),
    case("lone surrogate in the tenant", TASK, None, TENANT, tenant="t\udfff"),
    case("NUL in the tenant", TASK, None, TENANT, tenant="t\x00"),
    case("trailing newline in the tenant", TASK, None, TENANT, tenant="acme\n"),
    case("empty tenant", TASK, None, TENANT, tenant=""),
    case("overlong tenant", TASK, None, TENANT, tenant="t" * 65),
    case("None tenant", TASK, None, TENANT, tenant=None),
    case("bytes tenant", TASK, None, TENANT, tenant=b"acme"),
]


def assert_refused(error: BaseException, expected: type[E.CommitlineError], loc: list | None) -> None:
    """``error`` is exactly ``expected``, names ``loc`` first (InvalidCommand) and serialises as JSON."""
    assert type(error) is expected, repr(error)
    assert isinstance(error, E.CommitlineError)
    assert orjson.loads(orjson.dumps(error.to_dict()))["code"] == expected.code
    if expected is E.InvalidCommand:
        assert error.errors[0]["loc"] == loc, error.errors
        assert all(set(problem) == {"loc", "msg", "type"} and problem["msg"] for problem in error.errors)
    elif expected is E.InvalidIdempotencyKey:
        assert error.details()["reason"].startswith("the idempotency key")
    elif expected is E.InvalidTenant:
        assert error.details()["tenant"].isprintable()


class _Untouchable:
    """A store that fails the test if dispatch reaches it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was used ({name}) for input that should have been refused")


@pytest.mark.parametrize(("command", "key", "tenant", "error", "loc"), BAD_INPUTS)
def test_bad_input_is_refused_before_the_store(command: Any, key: Any, tenant: Any,
                                               error: type[E.CommitlineError], loc: list | None) -> None:
    with pytest.raises(E.CommitlineError) as caught:
        CommandProcessor(_Untouchable(), EXAMPLES.catalog).dispatch(  # type: ignore[arg-type]
            command, idempotency_key=key, tenant=tenant)
    assert_refused(caught.value, error, loc)


def test_every_problem_is_listed_with_its_location() -> None:
    with pytest.raises(E.InvalidCommand) as caught:
        parse_command({**ISSUE, "user_ids": ["ok", "nul\x00", b"bytes", "x" * 5000], "extra": {1, 2}})
    assert [(p["loc"], p["type"]) for p in caught.value.errors] == [
        (["user_ids", 1], "string_invalid"), (["user_ids", 2], "json_type"), (["user_ids", 3], "string_invalid"),
        (["extra"], "json_type"),
    ]
    assert caught.value.command_type == "issue_survey_task"
    assert "user_ids.1: contains NUL (U+0000) at position 3" in str(caught.value)


def test_uuid_and_decimal_objects_are_accepted_in_their_fields_only() -> None:
    pid = uuid4()
    from_objects = parse_command({**PAYMENT, "amount": Decimal("12.50"), "payment_id": pid})
    assert from_objects == parse_command({**PAYMENT, "payment_id": str(pid)})
    assert isinstance(from_objects, CreatePayment) and from_objects.payment_id == pid
    with pytest.raises(E.InvalidCommand) as caught:
        parse_command({**PAYMENT, "account": pid})
    assert caught.value.errors[0]["msg"] == "UUID is not a JSON value (a UUID object is accepted in payment_id only)"
    issued = parse_command({**ISSUE, "user_ids": ("u1", "u2")})
    assert isinstance(issued, IssueSurveyTask) and issued.user_ids == ("u1", "u2")


@pytest.mark.parametrize(("field", "text"), [("amount", "12.50\n"), ("payment_id", f"{uuid4()}\n")])
def test_a_final_newline_is_not_part_of_an_amount_or_an_id(field: str, text: str) -> None:
    """As the OpenAPI patterns say (a regular expression's "$" would let one final newline pass)."""
    with pytest.raises(E.InvalidCommand) as caught:
        parse_command({**PAYMENT, field: text})
    assert caught.value.errors[0]["loc"] == [field]


def test_amounts_up_to_the_maximum_are_accepted() -> None:
    assert parse_command({**PAYMENT, "amount": "999999999999999.99"}).amount == Decimal("999999999999999.99")
    assert parse_command({**PAYMENT, "amount": 10**15 - 1}).amount == Decimal(10**15 - 1)
    assert parse_command({**PAYMENT, "currency": "XAU", "amount": "0.12345678"}).amount == Decimal("0.12345678")
    with pytest.raises(E.InvalidCommand, match="less than 10\\^15"):
        parse_command(payment_text("9223372036854775807"))


def test_a_json_number_whose_digits_are_whole_is_that_integer() -> None:
    assert parse_command(payment_text("14.0")).amount == Decimal(14)
    assert parse_command(payment_text("1e3")).amount == Decimal(1000)
    assert parse_command(payment_text("12.000000000000000000")).amount == Decimal(12)
    with pytest.raises(E.InvalidCommand, match="never a binary float"):
        parse_command(payment_text("12.0000000000000001"))  # a float would round it to 12


def test_an_amount_has_any_number_of_digits_within_the_string_limit() -> None:
    class Refund(Command):
        amount: Amount

    catalog = SimpleNamespace(public={"refund": Refund}, holds=lambda cls: cls is Refund,
                              public_types=lambda: ["refund"])
    digits = "1" + "0" * 400  # beyond what a float holds: still finite
    assert parse_for({"type": "refund", "amount": digits}, catalog).amount == Decimal(digits)


def test_models_pass_the_same_boundary() -> None:
    valid = CreateSurveyTask(title="t")
    assert parse_command(valid) is valid
    with pytest.raises(E.InvalidCommand) as nul:
        parse_command(CreateSurveyTask(title="a\x00"))  # pydantic itself lets NUL through
    assert nul.value.errors[0]["loc"] == ["title"] and nul.value.command_type == "create_survey_task"
    with pytest.raises(E.InvalidCommand) as unvalidated:
        parse_command(CreatePayment.model_construct(amount=12.5, currency="EUR", account="a"))
    assert unvalidated.value.errors[0]["loc"] == ["amount"]


class Slot(BaseModel):
    starts: time
    seats: int


class BookDay(Command):
    day: date
    at: datetime
    slot: Slot
    note: Text = ""  # a default its own type refuses: left out, as a JSON command that omits it leaves it out


def test_a_model_with_dates_and_nested_models_passes_as_its_json_would() -> None:
    catalog = SimpleNamespace(public={"book_day": BookDay}, holds=lambda cls: cls is BookDay,
                              public_types=lambda: ["book_day"])
    model = BookDay(day=date(2026, 12, 25), at=datetime(2026, 12, 1, 9, 30, tzinfo=timezone.utc),
                    slot=Slot(starts=time(9), seats=2))
    assert parse_for(model, catalog) is model
    as_json = {"type": "book_day", "day": "2026-12-25", "at": "2026-12-01T09:30:00Z",
               "slot": {"starts": "09:00:00", "seats": 2}}
    assert parse_for(as_json, catalog) == model


def test_limits_are_parameters() -> None:
    tight = CommandLimits(max_bytes=1024, max_string_length=40, max_list_length=2, max_depth=2)
    assert parse_command({**ISSUE, "user_ids": ["x" * 40, "d"]}, limits=tight).user_ids == ("x" * 40, "d")
    refusals = [({**TASK, "title": "x" * 41}, ["title"]), ({**ISSUE, "user_ids": ["a", "b", "c"]}, ["user_ids"]),
                ({**ISSUE, "user_ids": [["a"]]}, ["user_ids", 0]), (task_text('"%s"' % ("x" * 1024)), [])]
    for command, loc in refusals:
        with pytest.raises(E.InvalidCommand) as caught:
            parse_command(command, limits=tight)
        assert caught.value.errors[0]["loc"] == loc


def test_limits_come_from_the_environment() -> None:
    settings = load_settings({"COMMITLINE_MAX_COMMAND_BYTES": "2048", "COMMITLINE_MAX_STRING_LENGTH": "10",
                              "COMMITLINE_MAX_LIST_LENGTH": "7", "COMMITLINE_MAX_NESTING_DEPTH": "3"})
    assert settings.command_limits() == CommandLimits(2048, 10, 7, 3)
    assert load_settings({}).command_limits() == DEFAULT_LIMITS
    with pytest.raises(E.ConfigurationError) as caught:
        load_settings({"COMMITLINE_MAX_NESTING_DEPTH": "1"})
    assert caught.value.variable == "COMMITLINE_MAX_NESTING_DEPTH"


def test_usable_keys_and_tenants_pass_unchanged() -> None:
    assert check_idempotency_key("order-7 payment/~!", "create_payment") == "order-7 payment/~!"
    assert check_tenant("acme.eu-1_x") == "acme.eu-1_x"


@pytest.mark.parametrize("sent", ["k", " k", "k ", "\tk\t", "  k  "])
def test_white_space_around_a_key_is_not_part_of_it(sent: str) -> None:
    assert check_idempotency_key(sent, "create_payment") == "k"


@pytest.mark.parametrize(("sent", "said"), [
    ("order-7/é", "'é' (U+00E9) at position 8 is not"),
    ("clÃ©", "'Ã' (U+00C3) at position 2 is not"),
    ("💳", "(U+1F4B3) at position 0 is not"),
    ("a\x7fb", "unprintable character U+007F at position 1"),
    ("a\nb", "unprintable character U+000A at position 1"),
])
def test_a_key_is_printable_ascii_only(sent: str, said: str) -> None:
    with pytest.raises(E.InvalidIdempotencyKey) as refused:
        check_idempotency_key(sent, "create_payment")
    assert said in str(refused.value)


# -- property: whatever comes in, a Command or a typed error, never anything else -----------------------

ODD = ["\x00", "\udfff", "\ud800", "\n", "\u2028", "\ufeff", "é", "💳", "\x7f"]
text = st.text(st.one_of(st.characters(), st.sampled_from(ODD)), max_size=12)
field_names = st.sampled_from(sorted({name for cls in COMMAND_TYPES.values() for name in cls.model_fields}))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.integers(2**62, 2**70), st.integers(-(2**70), -(2**62)),
    st.floats(), text, st.binary(max_size=8), st.uuids(), st.uuids().map(str), st.decimals(),
    st.sampled_from(["12.50", "1e15", "-1", "EUR", "XAU", "0.123456789", ITEM]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(text, field_names, st.integers()), inner, max_size=4),
        st.frozensets(st.one_of(st.integers(), text), max_size=3), st.sets(st.integers(), max_size=3),
    ),
    max_leaves=12,
)
commands = st.one_of(
    st.builds(lambda kind, fields: {**fields, "type": kind}, st.one_of(st.sampled_from(sorted(COMMAND_TYPES)), text),
              st.dictionaries(st.one_of(field_names, text), values, max_size=6)),
    st.builds(lambda valid, name, value: {**valid, name: value}, st.sampled_from([PAYMENT, TASK, STOCK, ISSUE]),
              field_names, values),
    st.builds(lambda valid, value: {**valid[0], valid[1]: value},  # one field of a valid command changed
              st.sampled_from([(PAYMENT, "account"), (PAYMENT, "amount"), (TASK, "title"), (STOCK, "quantity"),
                               (ISSUE, "user_ids")]),
              st.one_of(text, scalars, st.lists(text, min_size=1, max_size=3))),
)


def forms(value: Any) -> list[Any]:
    """The value itself and, where Python's JSON writer can express it, as JSON text and UTF-8 bytes."""
    try:
        written = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return [value]
    return [value, written, written.encode("utf-8", "surrogatepass")]


def assert_command_or_typed_error(value: Any) -> None:
    try:
        command = parse_command(value)
    except E.CommitlineError as e:
        orjson.dumps(e.to_dict())  # every error can be printed as JSON (no lone surrogates)
        return
    assert isinstance(command, Command)
    stored = orjson.dumps(command.model_dump(mode="json"))  # what would be stored is valid UTF-8 ...
    assert b"\\u0000" not in stored  # ... without NUL


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(commands, values))
def test_any_input_gives_a_command_or_a_typed_error(value: Any) -> None:
    for form in forms(value):
        assert_command_or_typed_error(form)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | st.text(st.one_of(st.characters(), st.sampled_from(ODD)), max_size=64))
def test_any_text_gives_a_command_or_a_typed_error(raw: bytes | str) -> None:
    assert_command_or_typed_error(raw)


def test_a_model_of_another_class_with_a_known_type_is_named_as_such() -> None:
    class CreatePayment(Command):  # noqa: F811 - the point: the examples' type, another class
        amount: str

    with pytest.raises(E.InvalidCommand, match=r"this domain's create_payment is commitline\.examples\.payments\."
                                               r"CreatePayment, not tests\.unit\.test_command_boundary\."):
        parse_command(CreatePayment(amount="1"))


@pytest.mark.parametrize("text", [task_text('"a\\u0000b"'), payment_text("18446744073709551616"),
                                  payment_text("1e400")])
def test_json_text_refused_at_the_boundary_names_its_known_command_type(text: str) -> None:
    """A client reads which command was refused from ``command_type``, and the metrics count it under it: also
    when the refusal comes from reading the text (a NUL, an integer beyond 64 bits, a number beyond a float)."""
    with pytest.raises(E.InvalidCommand) as refused:
        parse_command(text.encode())
    assert refused.value.command_type == json.loads(text.replace("1e400", "1"))["type"], refused.value
    with pytest.raises(E.InvalidCommand) as unknown:  # an unknown type is not named as a command's
        parse_command(text.replace("create_", "make_").encode())
    assert unknown.value.command_type is None
