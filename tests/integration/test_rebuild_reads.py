"""A rebuild reads the log without the states of the events it only passes over: every notification still
comes (ids, order, gaps as before), with an empty state where its type is one of those named; an event of a
type the domain does not know is read whole, so it stops the rebuild naming its type, as it always did."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from uuid import uuid4

import pytest

from commitline.composition import Commitline
from commitline.examples.payments import PaymentCreated
from commitline.infrastructure.store.codec import encode_event
from commitline.projections.rebuild import RebuildError


def fill(app: Commitline) -> None:
    for i in range(3):
        app.dispatch({"type": "create_payment", "amount": f"{i}.50", "currency": "EUR", "account": f"a{i}"},
                     idempotency_key=f"pay-{i}")
        app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 5}, idempotency_key=f"stock-{i}")


def test_passed_over_events_come_without_their_states(app: Commitline) -> None:
    fill(app)
    full = app.recorder.select_notifications(1, 100)
    light = app.recorder.select_notifications(1, 100, without_states=["StockReceived"])
    assert [(n.id, n.topic, n.originator_id, n.originator_version) for n in light] == \
        [(n.id, n.topic, n.originator_id, n.originator_version) for n in full]
    assert {n.topic for n in full} == {"PaymentCreated", "StockReceived"}
    for whole, read in zip(full, light):
        assert read.state == (b"" if whole.topic == "StockReceived" else whole.state)
    assert [n.id for n in app.recorder.select_notifications(3, 2, without_states=["StockReceived"])] == [3, 4]


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
