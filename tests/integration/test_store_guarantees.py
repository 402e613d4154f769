"""The event store itself: crash safety, append-only history, snapshots, the gap-safe log."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
from uuid import UUID, uuid4

import psycopg
import pytest

from commitline.application.errors import ConcurrencyConflict
from commitline.examples.inventory import InventoryItem
from commitline.composition import Commitline, bootstrap
from commitline.infrastructure.store.codec import encode_event
from commitline.infrastructure.store.recorder import EventRecorder
from tests.domains import levels
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


def receive(app: Commitline, item_id: UUID, n: int, tag: str) -> None:
    """``n`` commands on one item, then the snapshots they offered written (they are written behind them)."""
    for i in range(n):
        app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1},
                     idempotency_key=f"{tag}-{item_id}-{i}")
    assert app.store.flush_snapshots(60)


def snapshot_versions(pg_dsn: str, schema: str) -> list[int]:
    with psycopg.connect(pg_dsn) as conn:
        return [r[0] for r in conn.execute(f"SELECT version FROM {schema}.snapshots ORDER BY version")]


def refuse_snapshots(pg_dsn: str, schema: str) -> None:
    """From now on the store refuses every snapshot with the error 'no snapshots today'."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$BEGIN RAISE EXCEPTION 'no snapshots today'; END$$")
        conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON {schema}.snapshots "
                     f"FOR EACH ROW EXECUTE FUNCTION {schema}.refuse()")


def test_dispatch_takes_snapshots_at_the_interval(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=10)) as app:
        item_id = uuid4()
        receive(app, item_id, 25, "r")
        assert snapshot_versions(pg_dsn, schema) == [20]  # a stream keeps its latest snapshot: 10's was replaced
        snapshot, tail, _ = app.recorder.load_stream(item_id, after_snapshot=True)
        assert snapshot.version == 20 and [e.originator_version for e in tail] == [21, 22, 23, 24, 25]


def test_a_new_snapshot_replaces_its_streams_older_ones_and_leaves_other_streams_alone(
        pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        a, b = uuid4(), uuid4()
        receive(app, a, 4, "first")
        receive(app, b, 2, "first")
        assert snapshot_versions(pg_dsn, schema) == [2, 4]  # b's at 2, a's at 4
        receive(app, a, 2, "second")
        assert snapshot_versions(pg_dsn, schema) == [2, 6]
        # Two snapshots of one stream in one batch (a statement does not see its own inserts, so it could not
        # delete the older of them): only the latest is written.
        latest = app.recorder.load_stream(a, after_snapshot=True)[0]
        assert latest is not None and latest.version == 6
        app.recorder.save_snapshots([dataclasses.replace(latest, version=5), latest])
        assert snapshot_versions(pg_dsn, schema) == [2, 6]
        with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as fresh:
            assert fresh.load(InventoryItem, a).on_hand == 6 and fresh.load(InventoryItem, b).on_hand == 2


def test_a_snapshot_of_a_history_the_log_does_not_hold_is_never_used(pg_dsn: str, schema: str) -> None:
    """A snapshot is used only while the log holds the event it was taken at, with the same chain hash. One of a
    lost history (taken on a primary lost in an asynchronous failover, written to the promoted standby by a
    writer that still had it queued) would otherwise hand every load a state and a head hash the log does not
    have: every append on the stream refused as not proving its predecessor, forever."""
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=10)) as app:
        item_id = uuid4()
        receive(app, item_id, 12, "r")
        assert snapshot_versions(pg_dsn, schema) == [10]
        stale = [(12, os.urandom(32)), (20, os.urandom(32))]  # the head with another hash, and beyond the head
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for version, event_hash in stale:
                conn.execute(f"INSERT INTO {schema}.snapshots (aggregate_id, version, aggregate_type, state, event_hash) "
                             f"SELECT aggregate_id, %s, aggregate_type, state, %s FROM {schema}.snapshots "
                             "WHERE version = 10", (version, event_hash))
        # the writer stores none such, and deletes nothing for it
        stored = app.recorder.load_stream(item_id, after_snapshot=True)[0]
        assert stored is not None and stored.version == 10
        app.recorder.save_snapshots([dataclasses.replace(stored, version=30, event_hash=os.urandom(32))])
        assert snapshot_versions(pg_dsn, schema) == [10, 12, 20]
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=10)) as fresh:  # nothing cached
        assert fresh.load(InventoryItem, item_id).on_hand == 12
        assert fresh.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1},
                              idempotency_key="after").version == 13
        assert fresh.store.load(InventoryItem, item_id, use_snapshot=True).on_hand == 13


def test_a_refused_snapshot_deletes_nothing(pg_dsn: str, schema: str) -> None:
    """The insert and the deletion of the older snapshots are one statement: when the store refuses the new
    one, the stream keeps the one it had, and loads still start from it."""
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        item_id = uuid4()
        receive(app, item_id, 2, "before")
        assert snapshot_versions(pg_dsn, schema) == [2]
        refuse_snapshots(pg_dsn, schema)
        receive(app, item_id, 2, "after")
        assert app.store.snapshots.failed == 1
        assert snapshot_versions(pg_dsn, schema) == [2]
        snapshot, tail, _ = app.recorder.load_stream(item_id, after_snapshot=True)
        assert snapshot.version == 2 and [e.originator_version for e in tail] == [3, 4]


def test_a_snapshot_being_deleted_by_another_transaction_is_skipped_not_waited_for(pg_dsn: str, schema: str) -> None:
    """Two writers (two processes) replacing one stream's snapshots never wait for each other, so they cannot
    deadlock: a row another transaction holds stays, and goes with the stream's next snapshot."""
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        item_id = uuid4()
        receive(app, item_id, 2, "a")
        with psycopg.connect(pg_dsn) as holder:  # a transaction holding the snapshot at 2, as a deletion would
            holder.execute(f"SELECT 1 FROM {schema}.snapshots WHERE version = 2 FOR UPDATE")
            receive(app, item_id, 2, "b")
            assert app.store.snapshots.failed == 0 and snapshot_versions(pg_dsn, schema) == [2, 4]
        receive(app, item_id, 2, "c")
        assert snapshot_versions(pg_dsn, schema) == [6]


def test_a_snapshot_the_store_refuses_fails_no_command(pg_dsn: str, schema: str, caplog) -> None:
    """Snapshots are written behind the commands: one the store refuses is logged and lost, every command is
    acknowledged and stored, and loads replay from the events."""
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        refuse_snapshots(pg_dsn, schema)
        item_id = uuid4()
        receive(app, item_id, 7, "r")
        assert app.store.snapshots.failed >= 1 and "no snapshots today" in caplog.text
        assert count_rows(pg_dsn, schema) == {"events": 7, "idempotency_keys": 7, "snapshots": 0}
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as fresh:
        assert fresh.load(InventoryItem, item_id).on_hand == 7
        assert fresh.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 1},
                              idempotency_key="r7").version == 8



def test_a_snapshot_its_own_class_cannot_decode_is_passed_over_and_no_more_are_taken(pg_dsn: str, schema: str,
                                                                                     caplog) -> None:
    """A snapshot is derived data. One the aggregate's own class cannot read back (a dict keyed by an enum of
    integers: JSON gives the keys back as strings) is logged and passed over, the stream replayed from its first
    event, so the aggregate stays usable; and the process takes no more snapshots of that class, which would only
    be written to be passed over again."""
    settings = settings_for(pg_dsn, schema, snapshot_interval=10)
    gauge = uuid4()

    def reach(app: Commitline, first: int, last: int) -> None:
        for i in range(first, last):
            app.dispatch({"type": "reach", "gauge_id": str(gauge), "level": 1 + i % 2}, idempotency_key=f"g-{i}")
        assert app.store.flush_snapshots(60)

    with bootstrap(settings, domain=levels.domain) as app:
        reach(app, 0, 12)
    assert snapshot_versions(pg_dsn, schema) == [10]
    with bootstrap(settings, domain=levels.domain) as fresh:  # nothing cached: the next command reads the snapshot
        reach(fresh, 12, 13)
        assert "cannot be decoded by the class that took it" in caplog.text
        assert fresh.store.load(levels.Gauge, gauge).by_level == {levels.Level.LOW: 7, levels.Level.HIGH: 6}
        reach(fresh, 13, 25)
        assert fresh.store.load(levels.Gauge, gauge).version == 25
    assert snapshot_versions(pg_dsn, schema) == [10], "no snapshot of Gauge taken since"

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
