"""Idempotency keys: one execution per (tenant, key), identical replays, reuse refused."""

from __future__ import annotations

from uuid import uuid4

import pytest

from commitline.application.errors import IdempotencyKeyReused
from commitline.application.results import DispatchResult
from commitline.composition import Commitline
from tests.integration.test_concurrency import new_payment, run_at_once
from tests.support import count_rows


def test_twenty_concurrent_dispatches_with_one_key_execute_once(app: Commitline, pg_dsn: str, schema: str) -> None:
    payment_id = new_payment(app)
    before = count_rows(pg_dsn, schema)
    command = {"type": "submit_payment", "payment_id": str(payment_id)}

    outcomes = run_at_once(20, lambda i: app.dispatch(command, idempotency_key="pay-once"))

    assert all(isinstance(o, DispatchResult) for o in outcomes), [o for o in outcomes if isinstance(o, Exception)]
    assert sum(not o.replayed for o in outcomes) == 1
    assert sum(o.replayed for o in outcomes) == 19
    first = next(o for o in outcomes if not o.replayed)
    assert all(o.model_copy(update={"replayed": False}) == first for o in outcomes)
    after = count_rows(pg_dsn, schema)
    assert after["events"] == before["events"] + 1
    assert after["idempotency_keys"] == before["idempotency_keys"] + 1


def test_sequential_retry_returns_the_stored_outcome(app: Commitline) -> None:
    command = {"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "acc"}
    first = app.dispatch(command, idempotency_key="k")
    again = app.dispatch(command, idempotency_key="k")
    assert again.replayed and not first.replayed
    assert again.model_copy(update={"replayed": False}) == first
    assert first.aggregate_id == again.aggregate_id  # derived from (tenant, key) when not given


def test_same_key_different_payload_is_refused_and_writes_nothing(app: Commitline, pg_dsn: str, schema: str) -> None:
    app.dispatch({"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "acc"}, idempotency_key="k")
    before = count_rows(pg_dsn, schema)
    with pytest.raises(IdempotencyKeyReused) as caught:
        app.dispatch({"type": "create_payment", "amount": "6.00", "currency": "EUR", "account": "acc"},
                     idempotency_key="k")
    assert caught.value.key == "k" and caught.value.original_command_type == "create_payment"
    assert count_rows(pg_dsn, schema) == before


def test_concurrent_twins_with_different_payloads(app: Commitline, pg_dsn: str, schema: str) -> None:
    outcomes = run_at_once(10, lambda i: app.dispatch(
        {"type": "receive_stock", "item_id": str(uuid4()), "quantity": i + 1}, idempotency_key="shared"))
    winners = [o for o in outcomes if isinstance(o, DispatchResult)]
    assert len(winners) == 1 and not winners[0].replayed
    assert all(isinstance(o, IdempotencyKeyReused) for o in outcomes if o is not winners[0])
    assert count_rows(pg_dsn, schema)["events"] == 1


def test_keys_are_scoped_by_tenant(app: Commitline) -> None:
    command = {"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "acc"}
    a = app.dispatch(command, idempotency_key="k", tenant="tenant-a")
    b = app.dispatch(command, idempotency_key="k", tenant="tenant-b")
    assert not a.replayed and not b.replayed and a.aggregate_id != b.aggregate_id
    assert b.events[0].tenant == "tenant-b"
