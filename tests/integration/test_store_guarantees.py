"""The event store itself: crash safety, append-only history, snapshots, the gap-safe log."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from uuid import uuid4

import psycopg
import pytest

from commitline.application.errors import ConcurrencyConflict
from commitline.examples.inventory import InventoryItem
from commitline.composition import Commitline, bootstrap
from commitline.infrastructure.store.codec import encode_event
from commitline.infrastructure.store.recorder import EventRecorder
from tests.integration.test_concurrency import new_payment
from tests.support import count_rows, settings_for


class InjectedCrash(RuntimeError):
    pass


def test_failure_between_insert_and_commit_leaves_nothing(app: Commitline, pg_dsn: str, schema: str) -> None:
    payment_id = new_payment(app)
    before = count_rows(pg_dsn, schema)

    def crash() -> None:
        raise InjectedCrash("after the inserts, before COMMIT")

    app.recorder.before_commit = crash
    with pytest.raises(InjectedCrash):
        app.dispatch({"type": "submit_payment", "payment_id": str(payment_id)}, idempotency_key="doomed")
    app.recorder.before_commit = None
    assert count_rows(pg_dsn, schema) == before
    # The key was not consumed: the retry executes for real.
    result = app.dispatch({"type": "submit_payment", "payment_id": str(payment_id)}, idempotency_key="doomed")
    assert not result.replayed and result.version == 2


def test_process_killed_before_commit_leaves_nothing(app: Commitline, pg_dsn: str, schema: str) -> None:
    payment_id = new_payment(app)
    before = count_rows(pg_dsn, schema)
    script = textwrap.dedent(f"""
        import os, signal
        from commitline.composition import bootstrap
        from tests.support import settings_for
        app = bootstrap(settings_for({pg_dsn!r}, {schema!r}))
        app.recorder.before_commit = lambda: os.kill(os.getpid(), signal.SIGKILL)
        app.dispatch({{"type": "submit_payment", "payment_id": "{payment_id}"}}, idempotency_key="killed")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert count_rows(pg_dsn, schema) == before
    assert app.dispatch({"type": "submit_payment", "payment_id": str(payment_id)},
                        idempotency_key="killed").replayed is False


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {s}.events SET state = 'x'::bytea",
        "DELETE FROM {s}.events",
        "TRUNCATE {s}.events",
    ],
)
def test_history_is_append_only(app: Commitline, pg_dsn: str, schema: str, statement: str) -> None:
    new_payment(app)
    with psycopg.connect(pg_dsn) as conn, pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
        conn.execute(statement.format(s=schema))
    assert count_rows(pg_dsn, schema)["events"] == 1


def test_long_streams_load_from_a_snapshot(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=100)) as app:
        item_id = uuid4()
        app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1}, idempotency_key="first")
        item = app.store.load(InventoryItem, item_id)
        events = []
        for _ in range(9_999):
            item.receive(1)
            events.extend(item.collect_events())
        # Written in chunks straight to the recorder (10,000 dispatches would only slow the test down),
        # then snapshotted the way the store does after a commit.
        for i in range(0, len(events), 500):
            app.recorder.append([encode_event(e, "default") for e in events[i:i + 500]])
        app.store._take_snapshot(item)  # noqa: SLF001
        assert app.store.flush_snapshots(60)
        snapshot, tail, _ = app.recorder.load_stream(item_id, after_snapshot=True)
        assert snapshot is not None and snapshot.version == 10_000 and tail == []
        loaded = app.store.load(InventoryItem, item_id)
        assert loaded == app.store.load(InventoryItem, item_id, use_snapshot=False)
        assert loaded.on_hand == 10_000 and loaded.version == 10_000

        app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 5}, idempotency_key="after")
        snapshot, tail, _ = app.recorder.load_stream(item_id, after_snapshot=True)
        assert snapshot is not None and snapshot.version == 10_000 and len(tail) == 1
        assert app.store.load(InventoryItem, item_id).on_hand == 10_005


def test_a_stream_that_is_most_of_its_table_is_read_by_its_key_not_by_a_scan_of_the_table(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    """The reads of a stream's tail after its snapshot (a load's, a command's) are planned as an index range on
    the primary key even when the statistics say the stream is the whole table: its tail is a small part of it."""
    item_id = uuid4()
    app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1}, idempotency_key="first")
    item = app.store.load(InventoryItem, item_id)
    for _ in range(2_999):
        item.receive(1)
    app.recorder.append([encode_event(e, "default") for e in item.collect_events()])
    app.store._take_snapshot(item)  # noqa: SLF001
    assert app.store.flush_snapshots(60)
    q = app.recorder._q  # noqa: SLF001
    statements = {"load": (q.stream_after_snapshot.as_string(None).replace("%(id)s", "$1"), "uuid", f"'{item_id}'"),
                  "command": (q.read_for_command.sql.decode(), "uuid, int8, text, text, bool",
                              f"'{item_id}', 0, 'default', 'no-such-key', true")}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"ANALYZE {schema}.events")
        for name, (text, types, values) in statements.items():
            conn.execute(f"PREPARE {name}({types}) AS {text}")
            for mode in ("force_custom_plan", "force_generic_plan"):
                conn.execute(f"SET plan_cache_mode = {mode}")
                plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE {name}({values})"))
                assert "Seq Scan" not in plan, f"{name}, {mode}:\n{plan}"
    assert app.store.load(InventoryItem, item_id).on_hand == 3_000


def test_dispatch_takes_snapshots_at_the_interval(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=10)) as app:
        item_id = uuid4()
        for i in range(25):
            app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1}, idempotency_key=f"r{i}")
        assert app.store.flush_snapshots(60)  # written behind the commands
        with psycopg.connect(pg_dsn) as conn:
            versions = [r[0] for r in conn.execute(f"SELECT version FROM {schema}.snapshots ORDER BY version")]
        assert versions == [10, 20]
        snapshot, tail, _ = app.recorder.load_stream(item_id, after_snapshot=True)
        assert snapshot.version == 20 and [e.originator_version for e in tail] == [21, 22, 23, 24, 25]


def test_a_snapshot_the_store_refuses_fails_no_command(pg_dsn: str, schema: str, caplog) -> None:
    """Snapshots are written behind the commands: one the store refuses is logged and lost, every command is
    acknowledged and stored, and loads replay from the events."""
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
                         "$$BEGIN RAISE EXCEPTION 'no snapshots today'; END$$")
            conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON {schema}.snapshots "
                         f"FOR EACH ROW EXECUTE FUNCTION {schema}.refuse()")
        item_id = uuid4()
        for i in range(7):
            app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1}, idempotency_key=f"r{i}")
        assert app.store.flush_snapshots(60)
        assert app.store.snapshots.failed >= 1 and "no snapshots today" in caplog.text
        assert count_rows(pg_dsn, schema) == {"events": 7, "idempotency_keys": 7, "snapshots": 0}
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as fresh:
        assert fresh.load(InventoryItem, item_id).on_hand == 7
        assert fresh.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1},
                              idempotency_key="r7").version == 8


def _hold_open_insert(pg_dsn: str, schema: str, started: threading.Event, release: threading.Event,
                      commit: bool) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SELECT pg_current_xact_id()")
        conn.execute(
            f"INSERT INTO {schema}.events (originator_id, originator_version, topic, state, prev_hash, event_hash) "
            "VALUES (%s, 1, %s, %s, %s, %s)",
            (uuid4(), "StockReceived", b"{}", bytes(32), bytes(32)),
        )
        started.set()
        release.wait(30)
        if commit:
            conn.commit()
        else:
            conn.rollback()


@pytest.mark.parametrize("commit", [True, False], ids=["late-commit", "abort"])
def test_the_log_never_passes_an_open_gap(app: Commitline, pg_dsn: str, schema: str, commit: bool) -> None:
    recorder: EventRecorder = app.recorder
    new_payment(app)  # notification 1
    started, release = threading.Event(), threading.Event()
    writer = threading.Thread(target=_hold_open_insert, args=(pg_dsn, schema, started, release, commit))
    writer.start()
    assert started.wait(10)  # notification 2 is drawn and uncommitted
    new_payment(app)  # notification 3 commits first
    try:
        assert [n.id for n in recorder.select_notifications(1, 10)] == [1]
        assert [n.id for n in recorder.select_notifications(1, 10)] == [1], "must keep waiting while 2 is open"
    finally:
        release.set()
        writer.join(30)
    expected = [1, 2, 3] if commit else [1, 3]
    assert [n.id for n in recorder.select_notifications(1, 10)] == expected
    assert [n.id for n in recorder.select_notifications(2, 10)] == expected[1:]


def test_log_reads_in_order_under_concurrent_writers(app: Commitline, pg_dsn: str, schema: str) -> None:
    from tests.integration.test_concurrency import run_at_once

    seen: list[int] = []
    done = threading.Event()

    def follow() -> None:
        position = 0
        while True:
            finished = done.is_set()
            batch = app.recorder.select_notifications(position + 1, 100)
            seen.extend(n.id for n in batch)
            if batch:
                position = batch[-1].id
            elif finished:
                return

    committed: list[int] = []  # list.append is atomic across threads

    def writer(i: int) -> None:
        for n in range(20):
            if i % 2:
                new_payment(app)
            else:  # all even writers hit one stream: conflicts abort inserts and leave permanent gaps
                try:
                    app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1},
                                 idempotency_key=f"w{i}-{n}")
                except ConcurrencyConflict:  # retries exhausted under this much contention: nothing stored
                    continue
            committed.append(1)

    item_id = uuid4()
    follower = threading.Thread(target=follow)
    follower.start()
    run_at_once(16, writer)
    done.set()
    follower.join(60)
    with psycopg.connect(pg_dsn) as conn:
        stored = [r[0] for r in conn.execute(f"SELECT notification_id FROM {schema}.events ORDER BY 1")]
    assert len(stored) == len(committed) >= 160
    assert stored[-1] > len(stored), "the workload was meant to leave gaps from aborted inserts"
    assert seen == stored, "the follower saw every committed event exactly once, in id order"
