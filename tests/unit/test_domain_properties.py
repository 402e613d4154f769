"""Property tests: random command sequences never reach a state the tables forbid, and
replaying the recorded events (through the stored encoding) rebuilds an equal aggregate."""

from __future__ import annotations

from decimal import Decimal
from uuid import uuid4

from hypothesis import given, settings
from hypothesis import strategies as st

from commitline.domain.errors import DomainError
from commitline.examples.inventory import InventoryItem, ReservationState
from commitline.examples.payments import PAYMENT_TRANSITIONS, PaymentTransaction
from commitline.examples import domain
from commitline.infrastructure.store.codec import EventCodec, decode_snapshot, encode_event, encode_snapshot


def roundtrip(events):  # through the exact bytes the store keeps
    stored = [encode_event(e, "tenant-a") for e in events]
    return [CODEC.decode_event(s.topic, s.originator_id, s.originator_version, s.state).event for s in stored]


payment_actions = st.lists(st.sampled_from(["submit", "complete", "fail"]), max_size=30)


@given(actions=payment_actions, cents=st.integers(min_value=1, max_value=10**12))
@settings(max_examples=200, deadline=None)
def test_payment_sequences_follow_the_table(actions: list[str], cents: int) -> None:
    payment = PaymentTransaction.create(uuid4(), amount=Decimal(cents) / 100, currency="EUR", account="acc")
    visited = [payment.state]
    for action in actions:
        before = (payment.state, payment.version)
        try:
            getattr(payment, action)(*(["reason"] if action == "fail" else []))
        except DomainError:
            assert (payment.state, payment.version) == before, "a refused command must change nothing"
            continue
        assert PAYMENT_TRANSITIONS.can(before[0], payment.state)
        visited.append(payment.state)
    events = payment.collect_events()
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    rebuilt = PaymentTransaction.replay(payment.id, roundtrip(events))
    assert rebuilt == payment
    assert decode_snapshot(PaymentTransaction, encode_snapshot(payment)) == payment


inventory_actions = st.lists(
    st.one_of(
        st.tuples(st.just("receive"), st.integers(1, 20)),
        st.tuples(st.just("reserve"), st.integers(0, 5), st.integers(1, 10)),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("fulfil"), st.integers(0, 5)),
    ),
    max_size=40,
)

CODEC = EventCodec(domain.check().registry)


@given(actions=inventory_actions)
@settings(max_examples=200, deadline=None)
def test_inventory_never_goes_negative_and_replays_equal(actions: list[tuple]) -> None:
    item = InventoryItem.receive_new(uuid4(), 5)
    for action, *args in actions:
        try:
            if action == "receive":
                item.receive(args[0])
            elif action == "reserve":
                item.reserve(f"r{args[0]}", args[1])
            else:
                getattr(item, action)(f"r{args[0]}")
        except DomainError:
            pass
        assert item.available >= 0 and item.on_hand >= 0 and item.reserved >= 0
        assert item.reserved == sum(
            r.quantity for r in item.reservations.values() if r.state is ReservationState.RESERVED
        )
    rebuilt = InventoryItem.replay(item.id, roundtrip(item.collect_events()))
    assert rebuilt == item
    assert decode_snapshot(InventoryItem, encode_snapshot(item)) == item
