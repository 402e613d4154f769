"""One saga's persistent failure never holds up the others: it is parked with its reason while the rest
complete, and an operator's retry through the running runner resumes it."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from decimal import Decimal
from uuid import UUID, uuid4

import orjson

from commitline.composition import Commitline
from commitline.examples.fulfilment import OrderFulfilment, SagaState, fulfilment_id
from commitline.examples.orders import Order
from tests.integration.http.conftest import cli_env
from tests.support import FollowerThread, wait_for
from tests.support import fulfilment_runner, make_saga, simulated_gateway


class BrokenForSomeAccounts:
    """The simulated gateway, except that authorizing for an account in ``broken`` raises an error no step
    handles (standing in for an adapter bug or data the gateway cannot take) until it is mended."""

    def __init__(self, inner, broken: set[str]):  # type: ignore[no-untyped-def]
        self.inner, self.broken = inner, broken

    def authorize(self, key: str, amount: Decimal, currency: str, account: str) -> str:
        if account in self.broken:
            raise RuntimeError(f"adapter bug: cannot encode account {account}")
        return self.inner.authorize(key, amount, currency, account)

    def capture(self, key: str) -> str:
        return self.inner.capture(key)

    def void(self, key: str) -> None:
        self.inner.void(key)


def states(app: Commitline, orders: list[UUID]) -> dict[UUID, SagaState | None]:
    return {o: app.store.load(OrderFulfilment, fulfilment_id(o)).state for o in orders}


def test_ten_failing_sagas_are_parked_while_190_complete(app: Commitline, pg_dsn: str, schema: str) -> None:
    item = uuid4()
    app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1000}, idempotency_key="stock")
    broken = {f"broken-{i}" for i in range(10)}
    gateway = BrokenForSomeAccounts(simulated_gateway(app), set(broken))
    saga = make_saga(app, gateway, attempts=2, backoff=0.01)
    accounts = [f"broken-{i // 20}" if i % 20 == 0 else f"acct-{i}" for i in range(200)]
    orders = {app.dispatch({"type": "place_order", "item_id": str(item), "quantity": 1, "amount": "10.00",
                            "currency": "EUR", "account": account},
                           idempotency_key=f"order-{i}").aggregate_id: account for i, account in enumerate(accounts)}
    failing = [o for o, a in orders.items() if a in broken]
    healthy = [o for o, a in orders.items() if a not in broken]
    assert len(failing) == 10 and len(healthy) == 190

    runner = FollowerThread(lambda: fulfilment_runner(app, saga, poll_interval=0.2))
    projector = FollowerThread(lambda: app.projector("order_fulfilments", poll_interval=0.2))
    with runner, projector:
        final = (SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.PARKED)
        wait_for(lambda: all(s in final for s in states(app, list(orders)).values()), "every saga to settle", 240)
        assert Counter(states(app, healthy).values()) == {SagaState.COMPLETED: 190}
        assert all(app.store.load(Order, o).state.value == "CONFIRMED" for o in healthy)
        parked = states(app, failing)
        assert set(parked.values()) == {SagaState.PARKED}
        reason = app.store.load(OrderFulfilment, fulfilment_id(failing[0])).stuck or ""
        assert "RuntimeError: adapter bug" in reason
        # the runner is not wedged: it has handled the whole log
        runner.wait_until_at(app.recorder.max_notification_id() or 0)
        assert runner.follower.metrics.parked >= 10  # counted apart from the instances it advanced

        # operators see the parked ones, with their reason, in `sagas list --failed` and in status
        projector.wait_until_at(app.recorder.max_notification_id() or 0)
        env = cli_env(pg_dsn, schema)
        listed = subprocess.run([sys.executable, "-m", "commitline.cli", "sagas", "list", "--failed", "--json"],
                                capture_output=True, text=True, env=env, timeout=120)
        assert listed.returncode == 0, listed.stderr
        rows = orjson.loads(listed.stdout)
        assert sorted(UUID(r["order_id"]) for r in rows) == sorted(failing)
        assert all(r["state"] == "PARKED" and "adapter bug" in r["stuck"] for r in rows)
        problems = [str(p) for p in app.status().problems()]
        assert sum("fulfilment PARKED: RuntimeError: adapter bug" in p for p in problems) == 10

        # mend the cause for one order and retry it through the running runner: it completes
        mended = failing[0]
        gateway.broken.discard(orders[mended])
        retried = subprocess.run([sys.executable, "-m", "commitline.cli", "sagas", "retry", str(mended)],
                                 capture_output=True, text=True, env=env, timeout=120)
        assert retried.returncode == 0, retried.stderr
        assert "resumed at RESERVED" in retried.stdout  # it was parked charging, after the reservation
        wait_for(lambda: states(app, [mended])[mended] is SagaState.COMPLETED, "the retried saga to complete", 120)
        assert app.store.load(Order, mended).state.value == "CONFIRMED"
        assert set(states(app, failing[1:]).values()) == {SagaState.PARKED}
