"""An erasure's notification can land while this process is reading the very key it erases, or while a command
holds an aggregate it decoded before: the key is not kept after the notification, a seal then gets the
subject a new key, and the aggregate is not put back into the cache. ``forget_all`` (a lost notification
connection) drops every key held, and a key being read as it runs serves that one use only."""

from __future__ import annotations

from uuid import UUID

from commitline import ERASED
from commitline.examples.payments import PaymentTransaction
from commitline.infrastructure.personal.keys import KeyRow
from commitline.infrastructure.store.aggregate_cache import AggregateCache, Entry
from tests.unit.keys_in_memory import codec
from tests.unit.test_personal_data import payment_created


def test_a_key_erased_while_it_is_read_is_not_kept() -> None:
    reader, keys = codec()
    event, payment = payment_created()
    stored = reader.encode(event, "acme", aggregate=payment)
    personal = reader.personal
    personal.forget_all()  # the key is read again at the next open
    read = keys.get

    def erased_meanwhile(key_id: UUID) -> KeyRow | None:
        row = read(key_id)
        personal.forget([key_id])  # the notification arrives after the row was read
        return row

    keys.get = erased_meanwhile  # type: ignore[method-assign]
    assert reader.decode_event(stored.topic, stored.originator_id, 1, stored.state).event.account is ERASED
    keys.get = read  # type: ignore[method-assign]
    assert reader.decode_event(stored.topic, stored.originator_id, 1, stored.state).event.account is ERASED
    assert personal.held() == 0


def test_a_key_read_while_every_key_is_dropped_serves_that_use_only() -> None:
    events, keys = codec()
    event, payment = payment_created()
    stored = events.encode(event, "acme", aggregate=payment)
    personal = events.personal
    personal.forget_all()
    assert personal.held() == 0
    read = keys.get

    def dropped_meanwhile(key_id: UUID) -> KeyRow | None:
        row = read(key_id)
        personal.forget_all()
        return row

    keys.get = dropped_meanwhile  # type: ignore[method-assign]
    assert events.decode_event(stored.topic, stored.originator_id, 1, stored.state).event.account == event.account
    assert personal.held() == 0


def test_a_seal_under_a_key_erased_while_it_is_read_gets_the_subject_a_new_key() -> None:
    events, keys = codec()
    event, payment = payment_created()
    first = events.encode(event, "acme", aggregate=payment)
    old_key = keys.rows[("acme", str(payment.id))].key_id
    personal = events.personal
    personal.forget_all()  # the key is read again at the next seal
    find_or_add = keys.find_or_add

    def erased_meanwhile(new: KeyRow) -> KeyRow:
        row = find_or_add(new)
        if row.key_id == old_key:  # the erasure commits, and its notification lands, after this read
            keys.erase(new.tenant, new.subject)
            personal.forget([old_key])
        return row

    keys.find_or_add = erased_meanwhile  # type: ignore[method-assign]
    again, _ = payment_created()
    second = events.encode(again, "acme", aggregate=payment)
    new_key = keys.rows[("acme", str(payment.id))].key_id
    assert new_key != old_key and str(new_key).encode() in second.state
    assert events.decode_event(second.topic, second.originator_id, 1, second.state).event.account == again.account
    assert events.decode_event(first.topic, first.originator_id, 1, first.state).event.account is ERASED


def test_an_aggregate_decoded_before_the_cache_was_cleared_is_not_put_back() -> None:
    cache = AggregateCache(10)
    _, payment = payment_created()
    decoded_in = cache.epoch
    cache.clear()  # an erasure
    cache.put(Entry(payment, "acme"), decoded_in)
    assert len(cache) == 0
    cache.put(Entry(PaymentTransaction.blank(payment.id), "acme"), cache.epoch)
    assert len(cache) == 1
