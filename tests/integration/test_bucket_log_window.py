"""A read of some buckets (``BucketLog.read`` for an instance owning part of them) looks at a bounded window of
ids: each read costs about ``limit`` events of its buckets, not the rest of the log, and a page cut short by the
window still says ``full`` (read on at once), so the buckets' events all come, in order, each once; an id at the
window's end that is drawn but not committed is never claimed read."""

from __future__ import annotations

import threading
from uuid import uuid4

from commitline.composition import Commitline
from commitline.infrastructure.store.log import BucketLog, bucket_of
from tests.support import hold_open_insert

BUCKETS = 16


def test_a_read_of_some_buckets_stops_at_its_window_and_reads_on_to_every_event_in_order(app: Commitline) -> None:
    # Items of bucket 0 are rare: most of the log belongs to the other buckets.
    mine = [i for i in (uuid4() for _ in range(400)) if bucket_of(i, BUCKETS) == 0][:2]
    others = [i for i in (uuid4() for _ in range(400)) if bucket_of(i, BUCKETS) not in (0, 1)][:20]
    for n in range(300):
        item = mine[n % 2] if n % 30 == 0 else others[n % 20]
        app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1}, idempotency_key=f"w{n}")
    head = app.recorder.max_notification_id()
    log = BucketLog(app.recorder, BUCKETS)
    limit = 5
    positions = {0: 0, 1: 0}
    seen = []
    reads = 0
    while min(positions.values()) < head:
        first = min(positions.values()) + 1
        page = log.read(positions, limit)
        reads += 1
        assert reads < 1_000
        # The window: ids up to first - 1 + limit * (16 buckets / 2 read), never the whole rest of the log.
        assert page.through <= first - 1 + limit * BUCKETS // 2
        assert page.full or page.through >= head, "a page cut short by its window says to read on"
        assert all(b in positions for b in page.buckets)
        seen.extend(n.id for n in page.notifications)
        positions = {b: max(p, page.through) for b, p in positions.items()}
    expected = sorted(n.id for n in app.recorder.select_notifications(1, 10_000)
                      if bucket_of(n.originator_id, BUCKETS) in positions)
    assert len(expected) == 10
    assert seen == expected, "every event of the buckets read, in id order, once"


def test_a_window_ending_in_an_open_gap_stops_before_it_and_reads_the_event_once_committed(
    app: Commitline, pg_dsn: str, schema: str
) -> None:
    limit = 5
    stop = limit * BUCKETS // 2  # the first read's window: ids 1..40
    mine = next(i for i in (uuid4() for _ in range(400)) if bucket_of(i, BUCKETS) == 0)
    others = [i for i in (uuid4() for _ in range(400)) if bucket_of(i, BUCKETS) not in (0, 1)][:5]
    for n in range(stop - 1):  # ids 1..39: none of the buckets read
        app.dispatch({"type": "receive_stock", "item_id": str(others[n % 5]), "quantity": 1}, idempotency_key=f"a{n}")
    drawn, release = threading.Event(), threading.Event()
    writer = threading.Thread(target=hold_open_insert,
                              args=(pg_dsn, schema, mine, "StockReceived", drawn, release))
    writer.start()
    try:
        assert drawn.wait(10)  # id 40, the window's last, drawn and not committed
        for n in range(20):  # ids 41..60 commit first
            app.dispatch({"type": "receive_stock", "item_id": str(others[n % 5]), "quantity": 1},
                         idempotency_key=f"b{n}")
        log = BucketLog(app.recorder, BUCKETS)
        positions = {0: 0, 1: 0}
        for _ in range(3):
            page = log.read(positions, limit)
            assert page.notifications == []
            assert page.through < stop, "a read never claims an id that may still commit"
            positions = {b: max(p, page.through) for b, p in positions.items()}
    finally:
        release.set()
        writer.join(30)
    seen = []
    while min(positions.values()) < (app.recorder.max_notification_id() or 0):
        page = log.read(positions, limit)
        seen.extend((n.id, n.originator_id) for n in page.notifications)
        positions = {b: max(p, page.through) for b, p in positions.items()}
    assert seen == [(stop, mine)], "the late event is read once it commits"
