"""The load a fleet (``tests/fleet.py``) serves in the fleet tests, over the built-in examples, and what it must
leave behind once everything caught up.

:class:`Workload` makes the commands: stock received on a few items (one shared by the threads), orders of
those items (each starts the fulfilment saga) and payments; ``start_fleet`` starts ``serve``, two
``publish``, ``project`` and ``sagas run``; ``all_running`` and ``caught_up`` are what a test waits for, and
the ``check_*`` functions assert that every key applied once and that the read models equal a recount.
"""

from __future__ import annotations

import uuid
from collections import Counter
from decimal import Decimal
from typing import Any

import psycopg

from commitline.composition import Commitline
from commitline.examples.inventory import InventoryItem
from commitline.examples.payments import PaymentTransaction
from tests.fleet import Fleet, Sent

TENANT = "acme"  # the tenant whose API key the load uses
SETTLED = ("COMPLETED", "COMPENSATED")  # where every fulfilment ends once the saga has run


class Workload:
    """The commands of the load: stock received on a few items (some shared by the threads), orders of those
    items (each starts the fulfilment saga) and payments; each a function of (thread, n), so that a retry
    sends the same command under the same key."""

    def __init__(self, threads: int):
        self.items = [uuid.uuid4() for _ in range(threads)]
        self.shared = uuid.uuid4()
        self.namespace = uuid.uuid4()

    def __call__(self, thread: int, n: int) -> dict[str, Any]:
        own = uuid.uuid5(self.namespace, f"{thread}-{n}")
        if n % 6 == 1:
            return {"type": "place_order", "order_id": str(own), "item_id": str(self.items[thread]), "quantity": 1,
                    "amount": "3.00", "currency": "EUR", "account": f"acc-{thread}"}
        if n % 6 == 4:
            return {"type": "create_payment", "payment_id": str(own), "amount": f"{n % 50 + 1}.25",
                    "currency": "EUR", "account": f"acc-{thread}"}
        item = self.shared if n % 6 == 5 else self.items[thread]
        return {"type": "receive_stock", "item_id": str(item), "quantity": n % 3 + 1}




def start_fleet(fleet: Fleet) -> str:
    """``serve`` (which migrates the schema), an API key, then the followers; returns the key."""
    fleet.serve()
    key = fleet.api_key(TENANT)
    fleet.start("publish-1", "publish")
    fleet.start("publish-2", "publish")
    fleet.start("project", "project")
    fleet.start("sagas", "sagas", "run")
    return key


def all_running(app: Commitline) -> bool:
    """Every follower runs, and the two publish instances share every bucket."""
    report = app.status()
    return (all(s.status == "running" for s in report.followers) and report.publisher is not None
            and len(report.publisher.members) == 2 and not report.publisher.unowned)


def caught_up(app: Commitline) -> bool:
    """Every follower that ever ran, and every publisher bucket, is running at the log head."""
    report = app.status()
    followers = [s for s in report.followers if s.recorded_status is not None]
    buckets = report.publisher.buckets if report.publisher else []
    return bool(followers) and bool(buckets) and all(
        s.status == "running" and s.position >= report.head for s in [*followers, *buckets])


def check_read_models(app: Commitline, dsn: str, schema: str, work: Workload) -> None:
    """inventory_levels and payment_totals equal a recount from the aggregates (the load's payments and the
    sagas')."""
    reads = app.read_models()
    for item in [*work.items, work.shared]:
        stock = app.load(InventoryItem, item)
        level = reads.inventory_level(item, tenant=TENANT)
        assert level is not None and (level.on_hand, level.reserved) == (stock.on_hand, stock.reserved), item
    recount: Counter[tuple[str, str]] = Counter()
    amounts: Counter[tuple[str, str]] = Counter()
    with psycopg.connect(dsn) as conn:
        payments = [p for (p,) in conn.execute(f"SELECT originator_id FROM {schema}.events "
                                                "WHERE topic LIKE '%PaymentCreated'").fetchall()]
    for payment_id in payments:
        payment = app.load(PaymentTransaction, payment_id)
        assert payment.state is not None
        group = (payment.state.value, payment.currency)
        recount[group] += 1
        amounts[group] += payment.amount  # type: ignore[assignment]
    totals = {(t.state, t.currency): (t.payments, Decimal(t.amount)) for t in reads.payment_totals(TENANT)}
    assert totals == {g: (n, Decimal(amounts[g])) for g, n in recount.items()}


def check_each_applied_once(dsn: str, schema: str, sent: list[Sent]) -> None:
    """As many StockReceived events per item as keys that received stock on it."""
    keys = Counter(s.command["item_id"] for s in sent if s.command["type"] == "receive_stock")
    with psycopg.connect(dsn) as conn:
        stored = dict(conn.execute(f"SELECT originator_id::text, count(*) FROM {schema}.events "
                                   "WHERE topic LIKE '%StockReceived' GROUP BY 1").fetchall())
    assert stored == dict(keys)
