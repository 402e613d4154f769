"""Order fulfilment saga on a real PostgreSQL: happy path, every failure's compensation, crashes at
every step boundary, 200 orders competing for 50 units, and a compensation that never succeeds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from decimal import Decimal
from uuid import UUID, uuid4

import psycopg
import pytest

from commitline import ERASED
from commitline.examples.fulfilment_saga import FulfilmentSaga
from commitline.examples.inventory import InventoryItem
from commitline.examples.fulfilment import (
    FulfilmentRetried,
    OrderFulfilment,
    SagaState,
    fulfilment_id,
    payment_id_for,
)
from commitline.examples.orders import Order
from commitline.examples.payment_gateway import GatewayDeclined
from commitline.examples.simulated_gateway import SimulatedGateway
from commitline.examples.payments import PaymentTransaction
from commitline.composition import Commitline
from tests.integration.test_concurrency import run_at_once
from tests.support import FollowerThread
from tests.support import fulfilment_runner, make_saga, simulated_gateway


class Shop:
    def __init__(self, app: Commitline, stock: int = 10):
        self.app = app
        self.gateway = simulated_gateway(app)
        self.item = uuid4()
        app.dispatch({"type": "receive_stock", "item_id": str(self.item), "quantity": stock},
                     idempotency_key=f"stock-{self.item}")

    def saga(self, **kwargs: object) -> FulfilmentSaga:
        return make_saga(self.app, self.gateway, backoff=0.01, **kwargs)

    def runner(self) -> FollowerThread:
        return FollowerThread(lambda: fulfilment_runner(self.app, self.saga(), poll_interval=0.2))

    def place(self, account: str = "acct", quantity: int = 1) -> UUID:
        return self.app.dispatch({"type": "place_order", "item_id": str(self.item), "quantity": quantity,
                                  "amount": "25.00", "currency": "EUR", "account": account},
                                 idempotency_key=f"order-{uuid4()}").aggregate_id

    def run_until_done(self) -> None:
        with self.runner() as runner:
            runner.wait_until_at(self.app.recorder.max_notification_id(), timeout=120)
            deadline = time.monotonic() + 60
            while runner.follower.metrics.position < (self.app.recorder.max_notification_id() or 0):
                assert time.monotonic() < deadline
                time.sleep(0.05)

    def outcome(self, order_id: UUID) -> tuple[str | None, str | None, str | None, int]:
        """(saga state, order state, payment state, captures at the gateway)"""
        store = self.app.store
        saga = store.load(OrderFulfilment, fulfilment_id(order_id))
        order = store.load(Order, order_id)
        payment = store.load(PaymentTransaction, payment_id_for(order_id))
        captures = self.gateway.ledger_rows().get(FulfilmentSaga.gateway_key(order_id), ("", 0))[1]
        def value(state: object) -> str | None:  # None: not started yet (the runner has not reached it)
            return state.value if state is not None else None  # type: ignore[attr-defined]

        return (value(saga.state), value(order.state), value(payment.state), captures)

    def reserved_for(self, order_id: UUID) -> str | None:
        reservation = self.app.store.load(InventoryItem, self.item).reservations.get(str(order_id))
        return reservation.state.value if reservation else None


@pytest.mark.parametrize(
    ("account", "expected", "reservation"),
    [
        ("acct", ("COMPLETED", "CONFIRMED", "COMPLETED", 1), "RESERVED"),
        ("acct|authorize-declines", ("COMPENSATED", "CANCELLED", "FAILED", 0), "RELEASED"),
        ("acct|capture-declines", ("COMPENSATED", "CANCELLED", "FAILED", 0), "RELEASED"),
        ("acct|authorize-times-out-once", ("COMPLETED", "CONFIRMED", "COMPLETED", 1), "RESERVED"),
        ("acct|authorize-fails-once", ("COMPLETED", "CONFIRMED", "COMPLETED", 1), "RESERVED"),
    ],
    ids=["happy", "declined", "confirmation-fails", "timeout-then-success", "fails-once"],
)
def test_paths_through_the_saga(app: Commitline, account: str, expected: tuple, reservation: str) -> None:
    shop = Shop(app)
    order = shop.place(account)
    shop.run_until_done()
    assert shop.outcome(order) == expected
    assert shop.reserved_for(order) == reservation
    item = app.store.load(InventoryItem, shop.item)
    assert item.reserved == (1 if reservation == "RESERVED" else 0)


def test_the_saga_records_every_step(app: Commitline) -> None:
    shop = Shop(app)
    order = shop.place("acct|capture-declines")
    shop.run_until_done()
    saga = app.store.load(OrderFulfilment, fulfilment_id(order))
    assert saga.completed == ["reserve", "charge"] and saga.failed_step == "confirm"
    assert saga.compensated == ["confirm", "charge", "reserve"]
    assert "capture refused" in (saga.failure or "")


def test_an_order_cancelled_before_its_saga_began_is_neither_reserved_nor_charged(app: Commitline) -> None:
    shop = Shop(app)
    order = shop.place()
    app.dispatch({"type": "cancel_order", "order_id": str(order), "reason": "changed my mind"},
                 idempotency_key=f"cancel-{order}")
    shop.run_until_done()
    assert shop.outcome(order) == ("COMPENSATED", "CANCELLED", None, 0)
    assert shop.reserved_for(order) is None and shop.gateway.ledger_rows() == {}
    saga = app.store.load(OrderFulfilment, fulfilment_id(order))
    assert saga.failure == "reserve: the order was cancelled before its fulfilment began"


def test_an_order_of_an_id_that_is_no_item_is_cancelled_not_parked(app: Commitline) -> None:
    """An order's item id naming the tenant's own payment (an id of another aggregate type): the reservation is
    refused, as for an unknown item, and the order is cancelled; nothing waits for an operator."""
    shop = Shop(app)
    payment = app.dispatch({"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "a"},
                           idempotency_key=f"payment-{uuid4()}").aggregate_id
    order = app.dispatch({"type": "place_order", "item_id": str(payment), "quantity": 1, "amount": "25.00",
                          "currency": "EUR", "account": "acct"}, idempotency_key=f"order-{uuid4()}").aggregate_id
    shop.run_until_done()
    assert shop.outcome(order) == ("COMPENSATED", "CANCELLED", None, 0)
    saga = app.store.load(OrderFulfilment, fulfilment_id(order))
    assert saga.failed_step == "reserve" and "is a PaymentTransaction, not an InventoryItem" in (saga.failure or "")
    assert app.stuck_sagas() == []


KILL_SCRIPT = textwrap.dedent("""
    import asyncio, os, signal, sys
    from commitline.composition import bootstrap
    from tests.support import fulfilment_runner, make_saga, settings_for

    dsn, schema, boundary = sys.argv[1:4]
    app = bootstrap(settings_for(dsn, schema))
    def crash(at):
        if at == boundary:
            os.kill(os.getpid(), signal.SIGKILL)
    saga = make_saga(app, backoff=0.01, on_boundary=crash)
    async def main():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(30, stop.set)
        await fulfilment_runner(app, saga, poll_interval=0.2, workers=1).run(stop)
    asyncio.run(main())
    sys.exit(3)  # the boundary was never reached
""")


@pytest.mark.parametrize("boundary", ["reserve:reserved", "charge:submitted", "charge:authorized",
                                      "confirm:confirmed", "confirm:captured", "compensate:confirm",
                                      "compensate:charge", "compensate:reserve"])
def test_killed_at_each_step_boundary_then_restarted(app: Commitline, pg_dsn: str, schema: str,
                                                     boundary: str) -> None:
    shop = Shop(app)
    happy = shop.place("acct")
    doomed = shop.place("acct|capture-declines")
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, pg_dsn, schema, boundary], cwd=os.getcwd(),
                          capture_output=True, timeout=90)
    assert proc.returncode == -9, proc.stderr.decode()[-3000:]
    shop.run_until_done()
    assert shop.outcome(happy) == ("COMPLETED", "CONFIRMED", "COMPLETED", 1), "charged exactly once"
    assert shop.outcome(doomed) == ("COMPENSATED", "CANCELLED", "FAILED", 0), "never charged"
    assert shop.reserved_for(doomed) == "RELEASED", "no stock left reserved for a cancelled order"
    assert shop.gateway.ledger_rows()[FulfilmentSaga.gateway_key(doomed)][0] == "VOIDED"


def test_two_hundred_orders_compete_for_fifty_units(app: Commitline) -> None:
    shop = Shop(app, stock=50)
    orders: list[UUID] = []
    run_at_once(20, lambda i: orders.extend(shop.place(f"acct-{i}") for _ in range(10)))
    assert len(orders) == 200
    shop.run_until_done()
    outcomes = Counter(shop.outcome(o)[:2] for o in orders)
    assert outcomes == {("COMPLETED", "CONFIRMED"): 50, ("COMPENSATED", "CANCELLED"): 150}
    item = app.store.load(InventoryItem, shop.item)
    assert (item.on_hand, item.reserved, item.available) == (50, 50, 0)
    charged_cancelled = [o for o in orders if shop.outcome(o)[1] == "CANCELLED"
                         and app.store.load(PaymentTransaction, payment_id_for(o)).state is not None
                         and app.store.load(PaymentTransaction, payment_id_for(o)).state.value == "COMPLETED"]
    assert charged_cancelled == []
    completed_payment_events = [n for n in app.recorder.select_notifications(1, 100_000)
                                if n.topic == "PaymentCompleted"]
    assert len(completed_payment_events) == 50, "exactly one charge per confirmed order, none for the others"
    assert sum(c for _, c in shop.gateway.ledger_rows().values()) == 50


def test_a_compensation_that_keeps_failing_is_surfaced_as_stuck(app: Commitline, pg_dsn: str, schema: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    shop = Shop(app)
    order = shop.place("acct|capture-declines|void-fails")
    shop.run_until_done()
    saga = app.store.load(OrderFulfilment, fulfilment_id(order))
    assert saga.state.value == "STUCK" and saga.stuck.startswith("charge: GatewayUnavailable")
    assert any(r.levelname == "CRITICAL" and str(order) in r.getMessage() for r in caplog.records)
    with FollowerThread(lambda: app.projector("order_fulfilments", poll_interval=0.2)) as projector:
        projector.wait_until_at(app.recorder.max_notification_id())
    stuck = app.read_models().fulfilments(stuck_only=True)
    assert [(r.order_id, r.state) for r in stuck] == [(order, "STUCK")]
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    listed = subprocess.run([sys.executable, "-m", "commitline.cli", "sagas", "list", "--stuck"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and str(order) in listed.stdout and "STUCK" in listed.stdout
    assert f"{order}  tenant default  STUCK" in listed.stdout  # the tenant sagas show and retry need (-t)
    status = subprocess.run([sys.executable, "-m", "commitline.cli", "status", "--json"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert str(order) in status.stdout
    shown = subprocess.run([sys.executable, "-m", "commitline.cli", "sagas", "show", str(order)],
                           env=env, capture_output=True, text=True, timeout=60)
    assert "FulfilmentStuck" in shown.stdout and "FulfilmentStepFailed" in shown.stdout
    # Nothing was lost: the reservation is still held and the authorization still open until a person acts.
    assert shop.reserved_for(order) == "RESERVED"
    assert shop.outcome(order)[3] == 0


def stuck_then_fixed(app: Commitline, pg_dsn: str, schema: str) -> tuple[Shop, UUID]:
    """An order whose saga went STUCK undoing the charge, whose cause (the gateway's void) is then fixed."""
    shop = Shop(app)
    order = shop.place("acct|capture-declines|void-fails")
    shop.run_until_done()
    assert shop.outcome(order)[0] == "STUCK"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.simulated_gateway_ledger SET account = 'acct|capture-declines' "
                     "WHERE key = %s", (FulfilmentSaga.gateway_key(order),))
    return shop, order


def test_an_operator_retry_is_finished_by_the_running_runner_and_later_orders_keep_moving(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    shop, order = stuck_then_fixed(app, pg_dsn, schema)
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    with shop.runner() as runner:
        retried = subprocess.run([sys.executable, "-m", "commitline.cli", "sagas", "retry", str(order)],
                                 env=env, capture_output=True, text=True, timeout=60)
        assert retried.returncode == 0, retried.stderr[-3000:]
        later = shop.place("acct")
        deadline = time.monotonic() + 60
        while (shop.outcome(order)[0], shop.outcome(later)[0]) != ("COMPENSATED", "COMPLETED"):
            assert runner.error is None and time.monotonic() < deadline, (shop.outcome(order), shop.outcome(later))
            time.sleep(0.05)
    assert shop.outcome(order) == ("COMPENSATED", "CANCELLED", "FAILED", 0)
    assert shop.reserved_for(order) == "RELEASED"


def test_a_retry_recorded_before_it_named_the_order_is_resolved_through_the_saga(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    shop, order = stuck_then_fixed(app, pg_dsn, schema)
    saga = app.store.load(OrderFulfilment, fulfilment_id(order))
    saga._move(SagaState.COMPENSATING, FulfilmentRetried)  # as an older commitline recorded it: no order_id
    (legacy,) = saga.collect_events()
    assert legacy.order_id is None
    app.store.append(saga, [legacy], tenant="default", idempotency=None)
    shop.run_until_done()
    assert shop.outcome(order) == ("COMPENSATED", "CANCELLED", "FAILED", 0)


def test_erasing_a_payments_holder_erases_the_account_on_its_order_too(app: Commitline, pg_dsn: str,
                                                                       schema: str) -> None:
    """The order's account is the same personal value as its payment's (the saga copies it), under the same
    subject: one erasure leaves it readable nowhere, not in the events nor in the simulated gateway's ledger."""
    shop = Shop(app)
    account = "GB29NWBK60161331926819"
    order_id = shop.place(account=account)
    kept = shop.place(account="DE89370400440532013000")
    shop.run_until_done()
    assert shop.outcome(order_id)[:3] == ("COMPLETED", "CONFIRMED", "COMPLETED")
    with psycopg.connect(pg_dsn) as conn:
        stored = b"".join(bytes(r[0]) for r in conn.execute(f'SELECT state FROM "{schema}".events'))
        ledger = conn.execute(f'SELECT account FROM "{schema}".simulated_gateway_ledger').fetchall()
    assert account.encode() not in stored and ledger == [("",), ("",)]  # the ledger keeps behaviour tokens only

    erased = app.erase("default", str(payment_id_for(order_id)))
    assert [e.subject for e in erased] == [str(payment_id_for(order_id))]
    assert app.load(Order, order_id).account is ERASED
    assert app.load(PaymentTransaction, payment_id_for(order_id)).account is ERASED
    assert app.auditor().history(order_id).entries[0].payload["account"] == {"erased": True}
    assert app.load(Order, kept).account == "DE89370400440532013000"
    assert app.verify_chains().ok


class QuotingGateway(SimulatedGateway):
    """A gateway whose refusal quotes the account it refused, as real ones sometimes do."""

    def authorize(self, key: str, amount: Decimal, currency: str, account: str) -> str:
        raise GatewayDeclined(f"card declined for account {account}")


def test_a_refusal_that_quotes_the_account_is_stored_without_it(app: Commitline, pg_dsn: str, schema: str) -> None:
    shop = Shop(app)
    shop.gateway = QuotingGateway(app.conninfo, app.settings.schema_name)
    account = "FR7630006000011234567890189"
    order_id = shop.place(account=account)
    shop.run_until_done()
    assert shop.outcome(order_id)[:3] == ("COMPENSATED", "CANCELLED", "FAILED")
    with psycopg.connect(pg_dsn) as conn:
        stored = b"".join(bytes(r[0]) for r in conn.execute(f'SELECT state FROM "{schema}".events'))
    assert account.encode() not in stored and b"card declined for account <personal account>" in stored
    assert app.load(OrderFulfilment, fulfilment_id(order_id)).failure == (
        "charge: declined: card declined for account <personal account>")


def test_an_order_whose_account_was_erased_before_the_charge_is_compensated(app: Commitline) -> None:
    shop = Shop(app)
    order_id = shop.place(account="GB29NWBK60161331926819")
    app.erase("default", str(payment_id_for(order_id)))  # before the saga charged it: nobody left to charge
    shop.run_until_done()
    assert shop.outcome(order_id)[:2] == ("COMPENSATED", "CANCELLED")
    assert shop.reserved_for(order_id) == "RELEASED"
    assert app.load(OrderFulfilment, fulfilment_id(order_id)).failure == (
        "charge: the account was erased before the order was charged")
