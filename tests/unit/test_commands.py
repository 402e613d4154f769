"""Command validation: strict types, unknown fields and types rejected with typed errors."""

from __future__ import annotations

from decimal import Decimal
from uuid import UUID, uuid4

import pytest

from tests.support import parse_command
from commitline.examples.payments import CreatePayment
from commitline.application.errors import InvalidCommand, UnknownCommandType
from commitline.application.dispatching import fingerprint

PAYMENT = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-1"}


def test_valid_command_from_mapping_json_and_model_agree() -> None:
    from_mapping = parse_command(PAYMENT)
    assert isinstance(from_mapping, CreatePayment) and from_mapping.amount == Decimal("12.50")
    import orjson

    assert parse_command(orjson.dumps(PAYMENT)) == from_mapping
    assert parse_command(from_mapping) is from_mapping
    assert fingerprint(from_mapping) == fingerprint(parse_command(dict(PAYMENT)))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"amount": 12.5}, "amount"),
        ({"amount": "-1"}, "amount"),
        ({"amount": "0"}, "amount"),
        ({"amount": "abc"}, "amount"),
        ({"amount": "1.001"}, "amount"),
        ({"currency": "XXQ"}, "currency"),
        ({"currency": 978}, "currency"),
        ({"account": ""}, "account"),
        ({"surprise": 1}, "surprise"),
        ({"payment_id": "not-a-uuid"}, "payment_id"),
    ],
)
def test_bad_payment_fields_are_named(changes: dict, field: str) -> None:
    with pytest.raises(InvalidCommand) as caught:
        parse_command({**PAYMENT, **changes})
    assert caught.value.command_type == "create_payment"
    assert [e["loc"][0] for e in caught.value.errors] == [field]


@pytest.mark.parametrize("quantity", ["5", 5.0, True, 0, -1])
def test_quantities_are_strict_positive_integers(quantity: object) -> None:
    with pytest.raises(InvalidCommand):
        parse_command({"type": "reserve_stock", "item_id": str(uuid4()), "reservation_id": "r", "quantity": quantity})


def test_missing_field_and_unknown_type() -> None:
    with pytest.raises(InvalidCommand) as caught:
        parse_command({"type": "submit_payment"})
    assert caught.value.errors[0]["loc"] == ["payment_id"]
    with pytest.raises(UnknownCommandType) as unknown:
        parse_command({"type": "refund_everything"})
    assert "submit_payment" in unknown.value.known
    with pytest.raises(UnknownCommandType):
        parse_command({"amount": "1"})


def test_malformed_json_is_an_invalid_command() -> None:
    with pytest.raises(InvalidCommand, match="not valid JSON"):
        parse_command("{nope")
    with pytest.raises(InvalidCommand, match="JSON object"):
        parse_command("[1, 2]")


def test_ids_parse_from_strings() -> None:
    pid = uuid4()
    cmd = parse_command({"type": "submit_payment", "payment_id": str(pid), "expected_version": 1})
    assert cmd.payment_id == pid and isinstance(cmd.payment_id, UUID)


def test_errors_serialise_with_machine_readable_fields() -> None:
    with pytest.raises(InvalidCommand) as caught:
        parse_command({**PAYMENT, "amount": "-3"})
    data = caught.value.to_dict()
    assert data["code"] == "invalid_command" and data["error"] == "InvalidCommand"
    assert data["details"]["errors"][0]["loc"] == ["amount"]


def test_only_the_fulfilment_saga_confirms_an_order() -> None:
    """An order is confirmed once its payment is authorized: a client sending confirm_order (HTTP, CLI, a
    mapping) would confirm it unpaid, and then it could no longer be cancelled."""
    with pytest.raises(UnknownCommandType) as refused:
        parse_command({"type": "confirm_order", "order_id": "5d1c3a0e-8f0b-4c55-9d1e-1f7f6a0c2b11"})
    assert "confirm_order" not in refused.value.known and "place_order" in refused.value.known


def test_an_internal_command_sent_as_json_or_a_mapping_is_refused_saying_it_is_internal() -> None:
    """The examples' saga issues ``cancel_order_after_failure`` itself; sent from outside it is not an unknown type
    (which would send the caller looking for a typo) but one the domain keeps for its process managers."""
    for sent in ({"type": "cancel_order_after_failure"}, b'{"type": "cancel_order_after_failure"}'):
        with pytest.raises(UnknownCommandType) as refused:
            parse_command(sent)
        assert str(refused.value).startswith("'cancel_order_after_failure' is an internal command of the domain: "
                                             "only its process managers, or Python code passing the command object "
                                             "itself, issue it"), str(refused.value)
        assert refused.value.code == "unknown_command_type"
    with pytest.raises(UnknownCommandType, match="^unknown command type 'cancel_orders'"):
        parse_command({"type": "cancel_orders"})
