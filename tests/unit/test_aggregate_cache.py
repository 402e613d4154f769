"""The per-process aggregate cache (no database): bounded, lent out one at a time, never older than it was."""

from __future__ import annotations

from uuid import uuid4

from commitline.examples.inventory import InventoryItem
from commitline.infrastructure.store.aggregate_cache import AggregateCache, Entry


def entry(item_id: object, version: int) -> Entry:
    aggregate = InventoryItem.blank(item_id)  # type: ignore[arg-type]
    aggregate.version = version
    return Entry(aggregate, "default")


def test_a_late_put_of_an_older_copy_keeps_the_newer_one() -> None:
    cache, item = AggregateCache(10), uuid4()
    cache.put(entry(item, 5))
    cache.put(entry(item, 3))  # e.g. a thread whose put was delayed behind a later append of the stream
    taken = cache.take(item)
    assert taken is not None and taken.aggregate.version == 5
    assert cache.take(item) is None, "an entry is lent to one command at a time"


def test_least_recently_used_entries_and_distrusted_ids_go_first() -> None:
    cache, ids = AggregateCache(2), [uuid4() for _ in range(3)]
    for i in ids:
        cache.put(entry(i, 1))
        cache.distrust(i)
    assert len(cache) == 2 and cache.take(ids[0]) is None
    assert cache.trusted(ids[0]) and not cache.trusted(ids[1]) and not cache.trusted(ids[2])


def test_size_zero_keeps_nothing() -> None:
    cache, item = AggregateCache(0), uuid4()
    cache.put(entry(item, 1))
    cache.distrust(item)
    assert cache.take(item) is None and cache.trusted(item)
