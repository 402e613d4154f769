"""A log written under contention has a gap every few events (ids drawn by appends that lost their race and
rolled back). A reader proves every gap its read met at once, so passing them takes a read or two, not one read
per gap: a catch-up or a rebuild over such a log goes at the speed of reading it."""

from __future__ import annotations

import psycopg
import pytest

from commitline.composition import Commitline

pytestmark = pytest.mark.integration

GAPS = 300


def log_with_gaps(app: Commitline, pg_dsn: str, schema: str) -> int:
    """An event, then ``GAPS`` times an id drawn by a transaction that rolls back and an event after it."""
    item = app.dispatch({"type": "receive_stock", "item_id": "00000000-0000-4000-8000-000000000001", "quantity": 1},
                        idempotency_key="first").aggregate_id
    with psycopg.connect(pg_dsn) as conn:
        for n in range(GAPS):
            with conn.transaction(force_rollback=True):  # as an append that lost: its xid, then its id, undone
                conn.execute("SELECT pg_current_xact_id()")
                conn.execute(f"SELECT nextval(pg_get_serial_sequence('{schema}.events', 'notification_id'))")
            app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1}, idempotency_key=f"e{n}")
    head = app.recorder.max_notification_id()
    assert head == 2 * GAPS + 1
    return head


def test_a_follower_passes_every_gap_of_a_page_in_a_read_or_two(app: Commitline, pg_dsn: str, schema: str) -> None:
    head = log_with_gaps(app, pg_dsn, schema)
    position, reads, events = 0, 0, []
    while position < head:
        page, cutoff = app.recorder.log.read(position + 1, 10_000)
        reads += 1
        events.extend(n.id for n in page)
        position = cutoff - 1 if cutoff is not None else (page[-1].id if page else position)
        assert reads <= 10, f"{reads} reads for {GAPS} gaps"
    assert events == list(range(1, head + 1, 2)), "every event once, in order"


def test_a_rebuild_scan_passes_every_gap_of_a_page_in_a_read_or_two(app: Commitline, pg_dsn: str,
                                                                    schema: str) -> None:
    head = log_with_gaps(app, pg_dsn, schema)
    through, reads, events = 0, 0, []
    while through < head:
        scan = app.recorder.log.scan(through + 1, 10_000, passed_over=())
        reads += 1
        events.extend(n.id for n in scan.notifications)
        through = scan.through
        assert reads <= 10, f"{reads} scans for {GAPS} gaps"
    assert events == list(range(1, head + 1, 2))
