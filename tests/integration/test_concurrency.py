"""Concurrency on one stream (seeds 001 and 002): single winner at an expected version,
retries without one, and never a negative stock."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from uuid import UUID, uuid4

import pytest

from commitline.application.errors import CommitlineError, ConcurrencyConflict
from commitline.examples.inventory import InsufficientStock
from commitline.examples.inventory import InventoryItem
from commitline.composition import Commitline
from tests.support import count_rows


def run_at_once(n: int, work: Callable[[int], object]) -> list[object]:
    """Run ``work(i)`` in n threads released together by a barrier; collect results or exceptions."""
    barrier = threading.Barrier(n)
    outcomes: list[object] = [None] * n

    def body(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = work(i)
        except Exception as e:  # collected and asserted on by the caller
            outcomes[i] = e

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a dispatch hung"
    return outcomes


def new_payment(app: Commitline) -> UUID:
    result = app.dispatch(
        {"type": "create_payment", "amount": "99.99", "currency": "USD", "account": "acc-9"},
        idempotency_key=f"create-{uuid4()}",
    )
    return result.aggregate_id


@pytest.mark.parametrize("round_", range(5))
def test_fifty_concurrent_transitions_have_exactly_one_winner(app: Commitline, pg_dsn: str, schema: str, round_: int) -> None:
    payment_id = new_payment(app)
    app.dispatch({"type": "submit_payment", "payment_id": str(payment_id)}, idempotency_key=f"submit-{round_}")
    events_before = count_rows(pg_dsn, schema)["events"]

    outcomes = run_at_once(50, lambda i: app.dispatch(
        {"type": "complete_payment", "payment_id": str(payment_id), "expected_version": 2},
        idempotency_key=f"complete-{round_}-{i}",
    ))

    kinds = Counter("success" if not isinstance(o, Exception) else type(o).__name__ for o in outcomes)
    assert kinds == {"success": 1, "ConcurrencyConflict": 49}, kinds
    conflicts = [o for o in outcomes if isinstance(o, ConcurrencyConflict)]
    assert all(c.expected == 2 and c.actual == 3 for c in conflicts)
    assert count_rows(pg_dsn, schema)["events"] == events_before + 1
    assert count_rows(pg_dsn, schema)["idempotency_keys"] == 3  # create, submit, the one winner


def test_reservations_without_expected_version_retry_until_stock_runs_out(app: Commitline) -> None:
    item_id = uuid4()
    app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 25}, idempotency_key="receive")

    outcomes = run_at_once(40, lambda i: app.dispatch(
        {"type": "reserve_stock", "item_id": str(item_id), "reservation_id": f"order-{i}", "quantity": 1},
        idempotency_key=f"reserve-{i}",
    ))

    kinds = Counter("success" if not isinstance(o, Exception) else type(o).__name__ for o in outcomes)
    assert kinds == {"success": 25, "InsufficientStock": 15}, kinds
    assert all(o.available == 0 for o in outcomes if isinstance(o, InsufficientStock))
    item = app.store.load(InventoryItem, item_id)
    assert (item.on_hand, item.reserved, item.available) == (25, 25, 0)
    assert item.version == 26
    assert not [o for o in outcomes if isinstance(o, CommitlineError) and not isinstance(o, InsufficientStock)]
