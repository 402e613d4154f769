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

from commitline.composition import Commitline, bootstrap
from commitline.examples.payments import PaymentCreated
from commitline.infrastructure.store.codec import encode_event
from commitline.projections.rebuild import RebuildError
from tests.integration.test_projections import projector
from tests.support import hold_open_insert, settings_for, wait_for


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


def test_a_rebuild_racing_writers_leaves_no_event_behind(app: Commitline, pg_dsn: str, schema: str) -> None:
    """Writers of four apps (each its own transactions) write while the rebuild scans in small batches: the
    position it hands over, after scans that each pass most of their events over, is exactly where the live
    projector must go on, so every acknowledged payment is counted once (an id committed late inside a scan is
    the test above's: a race this short rarely lands one)."""
    writers, each = 8, 60
    created, failures = [0] * writers, []
    apps = [bootstrap(settings_for(pg_dsn, schema)) for _ in range(4)]

    def write(w: int) -> None:
        writer = apps[w % len(apps)]
        for n in range(each):
            try:
                writer.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1},
                                idempotency_key=f"s-{w}-{n}")  # passed over by payment_states
                writer.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "a"},
                                idempotency_key=f"p-{w}-{n}")
            except Exception as e:  # reported below: a writer must not die silently
                failures.append(e)
                return
            created[w] += 1

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: sum(created) >= 40, "the writers to get going")
        started_at = sum(created)
        result = app.rebuild("payment_states", batch_size=7)  # ends once it reaches the head after the writers
    finally:
        for thread in threads:
            thread.join(120)
        for writer in apps:
            writer.close()
    assert not failures, failures
    assert started_at < writers * each, "the rebuild began while the writers wrote"
    with projector(app, "payment_states") as running:
        running.wait_until_at(app.recorder.max_notification_id())
    totals = {(t.state, t.currency): t.payments for t in app.read_models().payment_totals()}
    assert result.events_applied >= started_at
    assert totals == {("CREATED", "EUR"): writers * each}, "every acknowledged payment counted once"


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
