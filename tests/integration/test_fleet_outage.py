"""PostgreSQL stops for two minutes under a running fleet of real processes (``serve``, two ``publish``,
``project``, ``sagas run``) and load over HTTP, then comes back on the same data and port: every process
recovers by itself, each follower logs the outage once as it starts and once as it ends, nothing acknowledged
is lost, a retry with its key applies once, Kafka holds every stored event in order, the read models equal a
recount and the audit verifies.

The outage lasts ``COMMITLINE_TEST_OUTAGE_S`` seconds (default 120: the suite runs the full two minutes).
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from commitline.composition import Commitline, bootstrap
from commitline.examples.inventory import InventoryItem
from commitline.examples.payments import PaymentTransaction
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from tests.fleet import (Fleet, Load, Sent, check_applied_once, check_kafka, fleet_env, outage_lines, read_kafka,
                         stored_events)
from tests.support import settings_for, wait_for

pytestmark = pytest.mark.integration

OUTAGE_S = float(os.environ.get("COMMITLINE_TEST_OUTAGE_S", "120"))
SCHEMA = "fleet"
TENANT = "acme"
FOLLOWER_PROCESSES = ("publish-1", "publish-2", "project", "sagas")
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


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(tmp_path / "pg")  # its own server: the session-wide one must never stop
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


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


def check_read_models(app: Commitline, dsn: str, work: Workload) -> None:
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
        payments = [p for (p,) in conn.execute(f"SELECT originator_id FROM {SCHEMA}.events "
                                                "WHERE topic LIKE '%PaymentCreated'").fetchall()]
    for payment_id in payments:
        payment = app.load(PaymentTransaction, payment_id)
        assert payment.state is not None
        group = (payment.state.value, payment.currency)
        recount[group] += 1
        amounts[group] += payment.amount  # type: ignore[assignment]
    totals = {(t.state, t.currency): (t.payments, Decimal(t.amount)) for t in reads.payment_totals(TENANT)}
    assert totals == {g: (n, Decimal(amounts[g])) for g, n in recount.items()}


def check_each_applied_once(dsn: str, sent: list[Sent]) -> None:
    """As many StockReceived events per item as keys that received stock on it."""
    keys = Counter(s.command["item_id"] for s in sent if s.command["type"] == "receive_stock")
    with psycopg.connect(dsn) as conn:
        stored = dict(conn.execute(f"SELECT originator_id::text, count(*) FROM {SCHEMA}.events "
                                   "WHERE topic LIKE '%StockReceived' GROUP BY 1").fetchall())
    assert stored == dict(keys)


def check_outage_logged_once(name: str, log: str) -> None:
    """Each follower of the process logged the outage once as it began and once as it ended, under no other
    subject; each LISTEN wake-up connection once as it broke and once as it listened again."""
    began, ended = outage_lines(log)
    assert began and began == ended and set(began.values()) == {1}, (name, began, ended)
    assert log.count("unavailable (StoreUnavailable") == len(began), (name, log[-5000:])
    broken, back = log.count("LISTEN fleet_events failed"), log.count("LISTEN fleet_events reconnected")
    assert broken == back <= len(began), (name, broken, back)


def test_a_two_minute_outage_under_load_loses_nothing_and_every_process_recovers_by_itself(
        server: EmbeddedPostgres, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = fleet_env(server.dsn, SCHEMA, kafka_bootstrap)
    work = Workload(threads=3)
    with Fleet(env, tmp_path / "logs") as fleet, ExitStack() as stack:
        key = start_fleet(fleet)
        app = stack.enter_context(bootstrap(settings_for(server.dsn, SCHEMA)))
        wait_for(lambda: all_running(app), "every follower to run", timeout=180)
        with Load(fleet.base_url, key, work, threads=3) as load:
            load.wait_acked(60, "the load to run")
            server.stop()
            stopped = time.monotonic()
            wait_for(lambda: fleet.ready() == 503, "/readyz to answer 503", timeout=60)
            wait_for(lambda: fleet.cli("status").returncode == 3, "commitline status to exit 3", timeout=60)
            refused = len(load.failed())
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))  # the outage itself
            assert len(load.failed()) > refused, "commands kept being refused during the outage"
            server.start()
            restarted = time.monotonic()
            wait_for(lambda: fleet.ready() == 200, "serve to be ready again", timeout=120)
            load.wait_acked(30, "commands to be acknowledged again")
            accepted = min(s.acked_at for s in load.acked() if s.acked_at > restarted)
        retried = load.retry_failed()
        sent = list(load.sent.values())

        wait_for(lambda: caught_up(app), "every follower and bucket to reach the head", timeout=300)
        orders = [uuid.UUID(s.command["order_id"]) for s in sent if s.command["type"] == "place_order"]
        wait_for(lambda: all((f := app.read_models().fulfilment(o, TENANT)) and f.state in SETTLED
                             for o in orders), "every order's fulfilment to settle", timeout=300)
        wait_for(lambda: caught_up(app), "every follower to reach the head after the sagas", timeout=300)
        check_applied_once(server.dsn, SCHEMA, TENANT, sent)
        check_each_applied_once(server.dsn, sent)
        duplicates = check_kafka(stored_events(server.dsn, SCHEMA), read_kafka(kafka_bootstrap, f"{SCHEMA}."))
        check_read_models(app, server.dsn, work)
        assert not app.read_models().fulfilments(stuck_only=True)

        verified = fleet.cli("audit", "verify", "--all")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        for name in FOLLOWER_PROCESSES:
            check_outage_logged_once(name, fleet.processes[name].output())
        codes = fleet.stop()
    assert codes == dict.fromkeys(codes, 0), codes
    for process in fleet.processes.values():
        assert "Traceback" not in process.output(), process.output()[-5000:]
    with capsys.disabled():
        print(f"\n[outage {OUTAGE_S:.0f} s] {len(sent)} commands, {retried} retried with their key, "
              f"{duplicates} duplicates in Kafka; first command accepted {accepted - restarted:.1f} s after restart")
