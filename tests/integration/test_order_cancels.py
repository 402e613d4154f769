"""Customers cancel orders at any moment of their fulfilment: before the saga starts, while it runs, and after
it completed. Whatever the moment, no cancelled order keeps a captured payment or reserved stock: a cancel
before confirmation is compensated by the saga, a cancel after it is refused (OrderAlreadyConfirmed)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from uuid import UUID, uuid4

from commitline.application.errors import CommitlineError, IllegalTransition
from commitline.examples.orders import OrderAlreadyConfirmed
from commitline.examples.fulfilment_saga import FulfilmentSaga
from commitline.composition import Commitline
from commitline.examples.fulfilment import OrderFulfilment, SagaState, fulfilment_id, payment_id_for
from commitline.examples.inventory import InventoryItem
from commitline.examples.orders import Order
from commitline.examples.payments import PaymentTransaction
from tests.support import FollowerThread, wait_for
from tests.support import fulfilment_runner, make_saga, simulated_gateway


def test_forty_cancels_at_random_moments_leave_nothing_captured_or_reserved(app: Commitline) -> None:
    rng = random.Random(20261121)
    item = uuid4()
    app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 500}, idempotency_key="stock")
    gateway = simulated_gateway(app)
    saga = make_saga(app, gateway, attempts=3, backoff=0.01)
    outcomes: Counter[str] = Counter()
    unexpected: list[BaseException] = []

    def cancel(order_id: UUID) -> None:
        try:
            app.dispatch({"type": "cancel_order", "order_id": str(order_id), "reason": "customer changed their mind"},
                         idempotency_key=f"cancel-{order_id}")
            outcomes["cancelled"] += 1
        except OrderAlreadyConfirmed:
            outcomes["refused: already confirmed"] += 1
        except IllegalTransition:  # the saga cancelled it first (not the case here: every order can be served)
            outcomes["refused: already cancelled"] += 1
        except CommitlineError as e:
            unexpected.append(e)

    def place() -> UUID:
        return app.dispatch({"type": "place_order", "item_id": str(item), "quantity": 1, "amount": "20.00",
                             "currency": "EUR", "account": "acct"}, idempotency_key=f"order-{uuid4()}").aggregate_id

    orders: list[UUID] = []
    before, during, after = [], [], []
    with FollowerThread(lambda: fulfilment_runner(app, saga, poll_interval=0.05, workers=4)):
        threads = []
        for i in range(100):
            order_id = place()
            orders.append(order_id)
            moment = i % 5
            if moment == 0 and len(before) < 13:  # at once, usually before the runner has seen the order
                before.append(order_id)
                cancel(order_id)
            elif moment in (1, 2) and len(during) < 14:  # at a random moment of the saga
                during.append(order_id)
                threads.append(threading.Timer(rng.uniform(0, 0.4), cancel, (order_id,)))
                threads[-1].start()
            elif moment == 3 and len(after) < 13:
                after.append(order_id)
            time.sleep(rng.uniform(0, 0.03))
        for t in threads:
            t.join()

        def settled(order_id: UUID) -> bool:
            return app.store.load(OrderFulfilment, fulfilment_id(order_id)).state in (
                SagaState.COMPLETED, SagaState.COMPENSATED)

        wait_for(lambda: all(settled(o) for o in after), "the sagas to be cancelled after completion to complete", 180)
        for order_id in after:  # after the saga completed
            cancel(order_id)
        wait_for(lambda: all(settled(o) for o in orders), "every saga to settle", 240)
    assert not unexpected, unexpected
    assert sum(outcomes.values()) == 40
    assert outcomes["refused: already confirmed"] >= 13 and outcomes["cancelled"] >= 1, outcomes

    ledger = gateway.ledger_rows()
    reservations = app.store.load(InventoryItem, item).reservations
    states: Counter[tuple[str, str]] = Counter()
    for order_id in orders:
        order = app.store.load(Order, order_id)
        payment = app.store.load(PaymentTransaction, payment_id_for(order_id))
        captured = ledger.get(FulfilmentSaga.gateway_key(order_id), ("", 0))
        reservation = reservations.get(str(order_id))
        states[(order.state.value, app.store.load(OrderFulfilment, fulfilment_id(order_id)).state.value)] += 1
        if order.state.value == "CANCELLED":
            assert captured[0] != "CAPTURED" and captured[1] == 0, (order_id, captured)
            assert payment.state is None or payment.state.value == "FAILED", (order_id, payment.state)
            assert reservation is None or reservation.state.value == "RELEASED", (order_id, reservation)
        else:
            assert order.state.value == "CONFIRMED", (order_id, order.state)
            assert captured == ("CAPTURED", 1) and payment.state.value == "COMPLETED", (order_id, captured)
    assert set(states) <= {("CANCELLED", "COMPENSATED"), ("CONFIRMED", "COMPLETED")}, states
    assert states[("CANCELLED", "COMPENSATED")] == outcomes["cancelled"]
