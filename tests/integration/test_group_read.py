"""Group read: the reads before concurrent commands share round trips, and each reader gets its own result
(``infrastructure/store/group_read.py``, ``StreamReads.read_many``), against the real PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID, uuid4


from commitline.composition import Commitline
from commitline.examples.inventory import InventoryItem
from commitline.infrastructure.store.group_read import GroupReader
from commitline.infrastructure.store.streams import CommandRead, ReadArgs
from commitline.composition import bootstrap
from tests.integration.test_concurrency import run_at_once
from tests.support import settings_for, wait_for


def item_with(app: Commitline, events: int) -> UUID:
    item_id = uuid4()
    for n in range(events):
        app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1}, idempotency_key=f"{item_id}-{n}")
    return item_id


def versions(read: CommandRead) -> list[int]:
    return [e.version for e in read.events]


def test_reads_in_one_round_trip_each_find_their_own_stream_and_key(app: Commitline) -> None:
    ids = [item_with(app, n) for n in (1, 2, 3)]
    reads = [ReadArgs(ids[0], 0, False, "default", "none"), ReadArgs(ids[2], 1, False, "default", "none"),
             ReadArgs(ids[1], 0, False, "default", f"{ids[1]}-0"), ReadArgs(ids[1], 0, False, "other", "none")]
    first, after_one, recorded, foreign = app.recorder.read_many(reads)
    assert versions(first) == [1] and first.idempotency is None  # type: ignore[union-attr]
    assert versions(after_one) == [2, 3]  # type: ignore[union-attr]
    assert recorded.idempotency is not None and recorded.idempotency.key == f"{ids[1]}-0"  # type: ignore[union-attr]
    assert versions(foreign) == [1, 2] and foreign.idempotency is None  # type: ignore[union-attr]


def test_readers_waiting_behind_a_round_trip_go_together_in_the_next_and_each_gets_its_own(
        app: Commitline) -> None:
    lengths = range(1, 13)
    items = {item_with(app, n): n for n in lengths}
    recorder = app.recorder
    reader = GroupReader(recorder, slots=1)  # one round trip in flight: the others queue behind it
    release = threading.Event()
    lone, batches = [], []
    single, many = recorder.read_for_command, recorder.read_many

    def held(*args: Any) -> CommandRead:
        lone.append(args[0])
        assert release.wait(60)
        return single(*args)

    def counted(reads: list[ReadArgs]) -> list[Any]:
        batches.append([r.aggregate_id for r in reads])
        return many(reads)

    recorder.read_for_command, recorder.read_many = held, counted  # type: ignore[method-assign]
    try:
        first = next(iter(items))
        results: dict[UUID, CommandRead] = {}

        def read(item_id: UUID) -> None:
            results[item_id] = reader.read(ReadArgs(item_id, 0, False, "default", "none"))

        holder = threading.Thread(target=read, args=(first,))
        holder.start()
        wait_for(lambda: lone, "the first read to be in flight")
        others = [i for i in items if i != first]
        threads = [threading.Thread(target=read, args=(i,)) for i in others]
        for t in threads:
            t.start()
        wait_for(lambda: len(reader._queue) == len(others), "the other reads to queue")  # noqa: SLF001
        release.set()
        for t in [holder, *threads]:
            t.join(60)
    finally:
        del recorder.read_for_command, recorder.read_many
    # The lone read goes through read_for_command (itself a batch of one); the queued ones in one round trip.
    assert lone == [first] and len(batches) == 2 and batches[0] == [first]
    assert sorted(map(str, batches[1])) == sorted(map(str, others))
    assert {i: versions(r) for i, r in results.items()} == {i: list(range(1, n + 1)) for i, n in items.items()}


def test_concurrent_commands_on_uncached_streams_decide_on_their_own_streams(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema, aggregate_cache_size=0, snapshot_interval=3)) as app:
        items = [item_with(app, 1 + n % 7) for n in range(24)]
        before = {i: app.store.load(InventoryItem, i).on_hand for i in items}
        outcomes = run_at_once(len(items), lambda k: app.dispatch(
            {"type": "receive_stock", "item_id": str(items[k]), "quantity": 100 + k}, idempotency_key=f"more-{k}"))
        assert all(not isinstance(o, BaseException) for o in outcomes), outcomes
        assert [o.version for o in outcomes] == [before[i] + 1 for i in items]  # type: ignore[union-attr]
        assert [app.store.load(InventoryItem, i, use_snapshot=False).on_hand for i in items] == [
            before[i] + 100 + k for k, i in enumerate(items)]
