"""A rebuild scans the log without the events it only passes over: the database looks at every one of them (their
ids prove the scan has no gap) but sends only the others, whole and in id order, and says how far the log is read,
so the rebuild's position still reaches the head. A scan never claims an id that is drawn and not yet committed:
it stops before it, and the event is read once it commits. An event of a type the domain does not know is sent
whole, so it stops the rebuild naming its type, as it always did."""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime, timezone
from uuid import uuid4

import pytest

from commitline.composition import Commitline
from commitline.examples.payments import PaymentCreated
from commitline.infrastructure.store.codec import encode_event
from commitline.projections.rebuild import RebuildError
from tests.support import hold_open_insert


def fill(app: Commitline) -> None:
    for i in range(3):
        app.dispatch({"type": "create_payment", "amount": f"{i}.50", "currency": "EUR", "account": f"a{i}"},
                     idempotency_key=f"pay-{i}")
        app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 5}, idempotency_key=f"stock-{i}")


def test_a_scan_sends_only_the_events_not_passed_over_and_says_how_far_it_read(app: Commitline) -> None:
    fill(app)
    full = app.recorder.select_notifications(1, 100)
    assert [n.topic for n in full] == ["PaymentCreated", "StockReceived"] * 3

    scan = app.recorder.scan_notifications(1, 100, ["StockReceived"])
    assert [(n.id, n.topic, n.originator_id, n.originator_version, n.state) for n in scan.notifications] == \
        [(n.id, n.topic, n.originator_id, n.originator_version, n.state) for n in full if n.topic == "PaymentCreated"]
    assert scan.through == 6 and not scan.full, "read to the head, the passed-over last event included"

    first_four = app.recorder.scan_notifications(1, 4, ["StockReceived"])
    assert [n.id for n in first_four.notifications] == [1, 3]
    assert first_four.through == 4 and first_four.full, "the limit counts the events looked at, not those sent"
    rest = app.recorder.scan_notifications(5, 4, ["StockReceived"])
    assert [n.id for n in rest.notifications] == [5] and rest.through == 6 and not rest.full

    nothing_sent = app.recorder.scan_notifications(2, 1, ["StockReceived"])
    assert nothing_sent.notifications == [] and nothing_sent.through == 2, "passed over, and still read past"
    beyond = app.recorder.scan_notifications(7, 100, ["StockReceived"])
    assert beyond.notifications == [] and beyond.through == 6 and not beyond.full


def test_a_scan_stops_before_an_id_not_yet_committed_and_reads_its_event_once_committed(
    app: Commitline, pg_dsn: str, schema: str
) -> None:
    fill(app)  # ids 1..6
    late = uuid4()
    drawn, release = threading.Event(), threading.Event()
    writer = threading.Thread(target=hold_open_insert,
                              args=(pg_dsn, schema, late, "PaymentCreated", drawn, release))
    writer.start()
    try:
        assert drawn.wait(10)  # id 7 drawn, not committed
        app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="after")
        app.dispatch({"type": "create_payment", "amount": "9.00", "currency": "EUR", "account": "b"},
                     idempotency_key="after-pay")  # ids 8 and 9 commit first
        for _ in range(3):
            scan = app.recorder.scan_notifications(7, 100, ["StockReceived"])
            assert scan.notifications == [] and scan.through == 6, "a scan never claims an id that may still commit"
            assert not scan.full
    finally:
        release.set()
        writer.join(30)
    scan = app.recorder.scan_notifications(7, 100, ["StockReceived"])
    assert [(n.id, n.originator_id) for n in scan.notifications][0] == (7, late)
    assert [n.id for n in scan.notifications] == [7, 9] and scan.through == 9


def test_a_rebuild_reaches_the_head_when_the_log_ends_in_events_it_passes_over(app: Commitline) -> None:
    fill(app)
    for i in range(4):
        app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key=f"tail-{i}")
    head = app.recorder.max_notification_id()
    result = app.rebuild("payment_states", batch_size=2)
    assert result.position == head == 10
    assert result.events_applied == 3
    totals = {(t.state, t.currency): t.payments for t in app.read_models().payment_totals()}
    assert totals == {("CREATED", "EUR"): 3}


def test_an_event_of_an_unknown_type_is_read_whole_and_stops_the_rebuild(app: Commitline) -> None:
    fill(app)
    event = PaymentCreated(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                           amount="1.00", currency="EUR", account="x")
    at = app.recorder.append([dataclasses.replace(encode_event(event, "default"), topic="RetiredEvent")])[0]
    with pytest.raises(RebuildError) as stopped:
        app.rebuild("payment_states")
    assert f"poison event at position {at} (RetiredEvent)" in str(stopped.value)
    assert "no event class is registered for stored type 'RetiredEvent'" in str(stopped.value)
    assert app.rebuild("payment_states", skip={at: "retired type"}).position == at
