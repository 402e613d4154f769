"""The error contract callers rely on: constructor arguments, ``code``, message and ``details()``."""

from __future__ import annotations

from decimal import Decimal
from uuid import UUID

import pytest

from commitline.application.errors import (
    AggregateAlreadyExists,
    AggregateNotFound,
    CommitlineError,
    ConcurrencyConflict,
    ConfigurationError,
    DomainError,
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidCommand,
    InvalidTenant,
    InvalidValue,
    MissingIdempotencyKey,
    StoreUnavailable,
    UnknownCommandType,
    WrongAggregateType,
)
from commitline.examples.inventory import DuplicateReservation, InsufficientStock, UnknownReservation
from commitline.examples.surveys import TaskClosed, UserNotIssued, UsersAlreadyIssued

ID = UUID("00000000-0000-4000-8000-000000000001")
MANY = [f"u{i:03}" for i in range(150)]

CASES = [
    (IllegalTransition("PaymentTransaction", "FAILED", "COMPLETED", iter(["PENDING"])), "illegal_transition",
     "PaymentTransaction cannot move from FAILED to COMPLETED; allowed from FAILED: PENDING",
     {"aggregate": "PaymentTransaction", "current": "FAILED", "requested": "COMPLETED", "allowed": ["PENDING"]}),
    (IllegalTransition("Order", "PLACED", "PLACED", {"CONFIRMED", "CANCELLED"}), "illegal_transition",
     "Order cannot move from PLACED to PLACED; allowed from PLACED: CANCELLED, CONFIRMED",
     {"aggregate": "Order", "current": "PLACED", "requested": "PLACED", "allowed": ["CANCELLED", "CONFIRMED"]}),
    (IllegalTransition("Order", "CANCELLED", "CONFIRMED", ()), "illegal_transition",
     "Order cannot move from CANCELLED to CONFIRMED; allowed from CANCELLED: none (terminal state)",
     {"aggregate": "Order", "current": "CANCELLED", "requested": "CONFIRMED", "allowed": []}),
    (IllegalTransition("Account", "NEW", "OPEN", ()), "illegal_transition",
     "Account cannot move from NEW to OPEN; allowed from NEW: none: a new aggregate's first event is emitted with "
     "_emit, whose _evolve sets its first state",
     {"aggregate": "Account", "current": "NEW", "requested": "OPEN", "allowed": []}),
    (InvalidValue("amount", Decimal("1.001"), "too precise"), "invalid_value", "amount=1.001: too precise",
     {"field": "amount", "value": "1.001", "reason": "too precise"}),
    (InsufficientStock("item-1", 2, 1), "insufficient_stock", "item item-1: requested 2, available 1",
     {"item_id": "item-1", "requested": 2, "available": 1}),
    (UnknownReservation("item-1", "r"), "unknown_reservation", "item item-1 has no reservation r",
     {"item_id": "item-1", "reservation_id": "r"}),
    (DuplicateReservation("item-1", "r"), "duplicate_reservation", "item item-1 already has a reservation r",
     {"item_id": "item-1", "reservation_id": "r"}),
    (UsersAlreadyIssued("t", reversed(MANY)), "users_already_issued",
     f"task t was already issued to 150 of these users: {', '.join(MANY[:10])} ...",
     {"task_id": "t", "count": 150, "user_ids": MANY[:100]}),
    (UsersAlreadyIssued("t", {"b", "a"}), "users_already_issued", "task t was already issued to 2 of these users: a, b",
     {"task_id": "t", "count": 2, "user_ids": ["a", "b"]}),
    (UserNotIssued("t", "u"), "user_not_issued", "task t was never issued to user u", {"task_id": "t", "user_id": "u"}),
    (TaskClosed("t", "issue"), "task_closed", "task t is closed: cannot issue", {"task_id": "t", "action": "issue"}),
    (InvalidCommand(None, [{"loc": [], "msg": "bad"}, {"loc": ["a", 1], "msg": "m"}]), "invalid_command",
     "invalid command: <command>: bad; a.1: m",
     {"command_type": None, "errors": [{"loc": [], "msg": "bad"}, {"loc": ["a", 1], "msg": "m"}]}),
    (UnknownCommandType(None, ["a", "b"]), "unknown_command_type",
     'the command names no type (its "type" field); known types: a, b',
     {"command_type": None, "known": ["a", "b"]}),  # null, as for a body that is not an object: not "None"
    (UnknownCommandType("nope", ["a"]), "unknown_command_type", "unknown command type 'nope'; known types: a",
     {"command_type": "nope", "known": ["a"]}),
    (UnknownCommandType({"a": 1}, ["a"]), "unknown_command_type",  # shown as the JSON it came as, not Python's repr
     'the command\'s "type" is {"a": 1}, not a string; known types: a', {"command_type": '{"a": 1}', "known": ["a"]}),
    (UnknownCommandType(True, ["a"]), "unknown_command_type", 'the command\'s "type" is true, not a string; known '
     "types: a", {"command_type": "true", "known": ["a"]}),
    (MissingIdempotencyKey("create_payment"), "missing_idempotency_key",
     "create_payment: state-changing commands require an idempotency key",
     {"command_type": "create_payment", "reason": "state-changing commands require an idempotency key"}),
    (MissingIdempotencyKey("create_payment", "too long"), "missing_idempotency_key", "create_payment: too long",
     {"command_type": "create_payment", "reason": "too long"}),
    (InvalidTenant(None), "invalid_tenant",
     "tenant None must be 1-64 characters of letters, digits, '.', '_' or '-'", {"tenant": "None"}),
    (IdempotencyKeyReused("acme", "k1", "create_payment"), "idempotency_key_reused",
     "idempotency key 'k1' (tenant 'acme') was already used for a different create_payment request",
     {"tenant": "acme", "key": "k1", "original_command_type": "create_payment", "command_type": None}),
    (IdempotencyKeyReused("acme", "k1", "create_payment", "submit_payment"), "idempotency_key_reused",
     "idempotency key 'k1' (tenant 'acme') was already used for a create_payment request, not this submit_payment",
     {"tenant": "acme", "key": "k1", "original_command_type": "create_payment", "command_type": "submit_payment"}),
    (ConcurrencyConflict(ID, 3, 4), "concurrency_conflict", f"stream {ID} is at version 4, the command expected 3",
     {"aggregate_id": str(ID), "expected_version": 3, "actual_version": 4, "attempts": 1}),
    (ConcurrencyConflict(ID, None, 4, 5), "concurrency_conflict",
     f"stream {ID} kept moving: gave up after 5 attempts (now at version 4)",
     {"aggregate_id": str(ID), "expected_version": None, "actual_version": 4, "attempts": 5}),
    (AggregateNotFound("Order", ID), "aggregate_not_found", f"no Order with id {ID}",
     {"aggregate_type": "Order", "aggregate_id": str(ID)}),
    (AggregateAlreadyExists("Order", ID), "aggregate_already_exists", f"an Order with id {ID} already exists",
     {"aggregate_type": "Order", "aggregate_id": str(ID)}),
    (WrongAggregateType(ID, "Order", "PaymentTransaction"), "wrong_aggregate_type",
     f"{ID} is a PaymentTransaction, not an Order", {"aggregate_id": str(ID), "expected": "Order",
                                                    "actual": "PaymentTransaction"}),
    (ConfigurationError("COMMITLINE_X", "bad {value}"), "configuration_error", "COMMITLINE_X: bad {value}",
     {"variable": "COMMITLINE_X", "reason": "bad {value}"}),
    (StoreUnavailable("refused"), "store_unavailable", "event store unavailable: refused", {"reason": "refused"}),
]


@pytest.mark.parametrize(("error", "code", "message", "details"), CASES, ids=[type(c[0]).__name__ for c in CASES])
def test_code_message_and_details(error: CommitlineError, code: str, message: str, details: dict) -> None:
    assert (error.code, str(error), error.details()) == (code, message, details)
    assert list(error.details()) == list(details), "the order of the fields is part of the output"
    assert error.to_dict() == {"error": type(error).__name__, "code": code, "message": message, "details": details}


def test_fields_are_attributes_and_keywords_work() -> None:
    error = InsufficientStock(item_id="i", requested=3, available=0)
    assert (error.item_id, error.requested, error.available) == ("i", 3, 0)
    assert isinstance(error, DomainError) and not isinstance(StoreUnavailable("x"), DomainError)
    assert ConcurrencyConflict(ID, 1, 2).attempts == 1


@pytest.mark.parametrize(("args", "kwargs"), [(("i", 1), {}), (("i", 1, 2, 3), {}), (("i", 1, 2), {"item_id": "j"}),
                                              (("i", 1, 2), {"colour": "red"})])
def test_wrong_arguments_are_a_type_error(args: tuple, kwargs: dict) -> None:
    with pytest.raises(TypeError):
        InsufficientStock(*args, **kwargs)


def test_a_whole_number_beyond_64_bits_is_given_as_text_so_the_error_can_be_encoded() -> None:
    import orjson

    error = InsufficientStock(item_id="i", requested=10**30, available=2**63 - 1)
    assert error.details() == {"item_id": "i", "requested": str(10**30), "available": 2**63 - 1}
    assert orjson.loads(orjson.dumps(error.to_dict()))["details"]["requested"] == str(10**30)
