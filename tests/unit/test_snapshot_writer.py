"""The snapshot writer on its own: what it writes, when, and what it gives up (the store's insert is a
function handed to it; tests/integration/test_store_guarantees.py runs it against PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from uuid import uuid4

from commitline.application.errors import StoreUnavailable
from commitline.infrastructure.store.snapshot_writer import SnapshotWriter, flush_all
from commitline.infrastructure.store.streams import Snapshot


def snapshot(version: int = 10) -> Snapshot:
    return Snapshot(uuid4(), version, "InventoryItem", b"{}", bytes(32))


class Inserts:
    """Records each batch it is given; fails the batches numbered in ``failing``; blocks while ``gate`` is clear."""

    def __init__(self, failing: frozenset[int] = frozenset()) -> None:
        self.batches: list[list[Snapshot]] = []
        self.failing = failing
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, batch: Sequence[Snapshot]) -> None:
        self.entered.set()
        assert self.gate.wait(30)
        self.calls += 1
        if self.calls in self.failing:
            raise RuntimeError("insert refused")
        self.batches.append(list(batch))


def test_offers_are_written_together_and_flush_waits_for_them() -> None:
    inserts = Inserts()
    writer = SnapshotWriter(inserts, linger_s=30)  # nothing but the flush makes it write before 30 s
    offered = [snapshot(v) for v in range(10, 60, 10)]
    for s in offered:
        writer.offer(s)
    assert writer.flush(30)
    assert [s for batch in inserts.batches for s in batch] == offered and len(inserts.batches) == 1
    assert writer.written == 5 and writer.dropped == writer.failed == 0
    writer.close()


def test_a_full_batch_is_written_without_waiting_for_the_linger() -> None:
    inserts = Inserts()
    writer = SnapshotWriter(inserts, batch=3, linger_s=30)
    for v in (10, 20, 30):
        writer.offer(snapshot(v))
    assert inserts.entered.wait(30)  # long before the 30 s linger
    assert writer.flush(30) and [len(b) for b in inserts.batches] == [3]
    writer.close()


def test_a_failed_insert_loses_its_batch_only_and_the_writer_goes_on(caplog) -> None:
    inserts = Inserts(failing=frozenset({1}))
    writer = SnapshotWriter(inserts, linger_s=0)
    writer.offer(snapshot(10))
    assert writer.flush(30)
    kept = snapshot(20)
    writer.offer(kept)
    assert writer.flush(30)
    assert inserts.batches == [[kept]] and writer.failed == 1 and writer.written == 1
    assert "1 snapshot(s) not saved" in caplog.text
    writer.close()


def test_an_outage_is_logged_in_one_line_without_a_traceback(caplog) -> None:
    def down(batch: Sequence[Snapshot]) -> None:
        raise StoreUnavailable("event store unavailable: connection refused")

    writer = SnapshotWriter(down, linger_s=0)
    writer.offer(snapshot())
    assert writer.flush(30) and writer.failed == 1
    (record,) = [r for r in caplog.records if "not saved" in r.getMessage()]
    assert "connection refused" in record.getMessage() and record.exc_info is None
    writer.close()


def test_offers_beyond_the_limit_are_dropped_without_blocking() -> None:
    inserts = Inserts()
    inserts.gate.clear()  # the first batch's insert hangs: everything else stays queued
    writer = SnapshotWriter(inserts, limit=2, batch=1, linger_s=0)
    writer.offer(snapshot(10))
    assert inserts.entered.wait(30)  # taken from the queue, being inserted
    for v in (20, 30, 40, 50):
        writer.offer(snapshot(v))  # two fit in the queue; two are dropped, and the call returns at once
    assert writer.dropped == 2
    assert not writer.flush(0.05)
    inserts.gate.set()
    assert writer.flush(30) and [s.version for b in inserts.batches for s in b] == [10, 20, 30]
    writer.close()


def test_close_writes_what_is_queued_and_later_offers_are_ignored() -> None:
    inserts = Inserts()
    writer = SnapshotWriter(inserts, linger_s=30)
    writer.offer(snapshot(10))
    writer.close()
    assert [s.version for b in inserts.batches for s in b] == [10]
    writer.offer(snapshot(20))
    assert writer.flush(1) and len(inserts.batches) == 1


def test_flush_all_waits_for_every_writer_of_the_process() -> None:
    first, second = Inserts(), Inserts()
    writers = [SnapshotWriter(first, linger_s=30), SnapshotWriter(second, linger_s=30)]
    for writer in writers:
        writer.offer(snapshot())
    assert flush_all(30)
    assert len(first.batches) == len(second.batches) == 1
    for writer in writers:
        writer.close()
