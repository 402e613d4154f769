"""Projections on a real PostgreSQL: exact counters without contended rows, exactly-once batches,
poison events that stop and wait for an operator, and rebuilds that never show a half-built view."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from decimal import Decimal
from uuid import uuid4

import orjson
import psycopg
import pytest

from commitline.examples.payments import PaymentSubmitted
from commitline.examples.surveys import SurveyTask
from commitline.composition import Commitline, bootstrap
from commitline.infrastructure.store.codec import encode_event
from commitline.infrastructure.store.log import Scan
from tests.support import PROJECTIONS
from commitline.infrastructure.followers.interventions import InterventionRefused, retry, skip
from tests.integration.test_concurrency import run_at_once
from tests.support import FollowerThread, settings_for, wait_for


def projector(app: Commitline, name: str, **kwargs: object) -> FollowerThread:
    return FollowerThread(lambda: app.projector(name, poll_interval=0.2, **kwargs))



def lease_sessions(app: Commitline, projection: str) -> int:
    """Open lease connections of a projection's instances (each opens one on its first attempt), in this
    database: a projector of the same name on another database of the server is someone else's."""
    with app.datastore.get_connection() as conn:
        return conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = %s "
                            "AND datname = current_database()", (f"commitline {projection}",)).fetchone()["n"]


def own_status(app: Commitline, name: str) -> tuple[str, int | None]:
    statuses = app.status().followers
    (status,) = [s for s in statuses if s.name == name]
    return status.status, (status.error or {}).get("position")


def table_rows(dsn: str, schema: str, table: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return sorted(conn.execute(f"SELECT * FROM {schema}.{table}").fetchall(), key=repr)


def recount_tasks(app: Commitline, task_id) -> dict[str, int]:
    """Counts derived straight from the events, for comparison with the projection."""
    task = app.store.load(SurveyTask, task_id)
    answered = 0
    for n in app.recorder.select_notifications(1, 10**6):
        if n.topic == "SurveyTaskAnswered":
            answered += 1
    return {"PENDING": len(task.issued) - answered, "DONE": answered}


def sample_lock_waits(dsn: str, schema: str, stop: threading.Event, found: list) -> None:
    """Record every session seen waiting on a lock while touching a read-model table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            found.extend(conn.execute(
                "SELECT a.query FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                "WHERE NOT l.granted AND l.locktype = 'relation' AND l.relation::regclass::text LIKE %s",
                (f"{schema}.rm_%",)).fetchall())
            found.extend(conn.execute(
                "SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ("%rm_task_statuses%",)).fetchall())
            time.sleep(0.005)


def test_seed_003_load_counts_exactly_without_lock_waits(app: Commitline, pg_dsn: str, schema: str) -> None:
    task_id = app.dispatch({"type": "create_survey_task", "title": "seed 003"}, idempotency_key="t").aggregate_id
    app.dispatch({"type": "issue_survey_task", "task_id": str(task_id),
                  "user_ids": [f"u{n}" for n in range(10_000)]}, idempotency_key="issue-1")
    waits: list = []
    stop_sampling = threading.Event()
    sampler = threading.Thread(target=sample_lock_waits, args=(pg_dsn, schema, stop_sampling, waits))
    with projector(app, "task_statuses") as running:
        sampler.start()

        def work(i: int) -> object:
            if i == 0:
                return app.dispatch({"type": "issue_survey_task", "task_id": str(task_id),
                                     "user_ids": [f"u{n}" for n in range(10_000, 15_000)]}, idempotency_key="issue-2")
            for n in range(i - 1, 2000, 39):  # 39 answering threads share 2,000 users
                app.dispatch({"type": "answer_survey_task", "task_id": str(task_id), "user_id": f"u{n * 7}"},
                             idempotency_key=f"answer-{n}")
            return None

        outcomes = run_at_once(40, work)
        assert not [o for o in outcomes if isinstance(o, Exception)]
        running.wait_until_at(app.recorder.max_notification_id())
        stop_sampling.set()
        sampler.join(10)
    counts = app.read_models().task_counts(task_id)
    assert counts == {"PENDING": 13_000, "DONE": 2_000}
    assert counts == recount_tasks(app, task_id)
    assert app.read_models().tenant_task_counts("default") == {task_id: counts}
    assert waits == [], f"sessions waited on read-model locks: {waits[:3]}"


def mixed_workload(app: Commitline, tag: str) -> None:
    payments = []
    for n in range(30):
        r = app.dispatch({"type": "create_payment", "amount": f"{n + 1}.25", "currency": ["EUR", "USD"][n % 2],
                          "account": f"a{n}"}, idempotency_key=f"{tag}-p{n}")
        payments.append(str(r.aggregate_id))
    for n, pid in enumerate(payments):
        if n % 3:
            app.dispatch({"type": "submit_payment", "payment_id": pid}, idempotency_key=f"{tag}-s{n}")
        if n % 3 == 1:
            app.dispatch({"type": "complete_payment", "payment_id": pid}, idempotency_key=f"{tag}-c{n}")
        if n % 3 == 2:
            app.dispatch({"type": "fail_payment", "payment_id": pid, "reason": "x"}, idempotency_key=f"{tag}-f{n}")
    item = str(uuid4())
    app.dispatch({"type": "receive_stock", "item_id": item, "quantity": 10}, idempotency_key=f"{tag}-stock")
    for n in range(6):
        app.dispatch({"type": "reserve_stock", "item_id": item, "reservation_id": f"r{n}", "quantity": 1},
                     idempotency_key=f"{tag}-r{n}")
    app.dispatch({"type": "release_reservation", "item_id": item, "reservation_id": "r0"}, idempotency_key=f"{tag}-x")
    app.dispatch({"type": "fulfil_reservation", "item_id": item, "reservation_id": "r1"}, idempotency_key=f"{tag}-y")
    task = app.dispatch({"type": "create_survey_task", "title": "t"}, idempotency_key=f"{tag}-t").aggregate_id
    app.dispatch({"type": "issue_survey_task", "task_id": str(task), "user_ids": [f"u{i}" for i in range(50)]},
                 idempotency_key=f"{tag}-i")
    for i in range(20):
        app.dispatch({"type": "answer_survey_task", "task_id": str(task), "user_id": f"u{i}"},
                     idempotency_key=f"{tag}-a{i}")


ALL_TABLES = [t.name for p in PROJECTIONS.values() for t in p.tables]


def project_live(app: Commitline, *runs: str) -> None:
    """Run ``mixed_workload`` once per run name while every projection follows live, up to the log head."""
    threads = [projector(app, name).start() for name in PROJECTIONS]
    try:
        for run in runs:
            mixed_workload(app, run)
        for t in threads:
            t.wait_until_at(app.recorder.max_notification_id())
    finally:
        for t in threads:
            t.stop()


def test_rebuilt_view_equals_live_view_table_for_table(app: Commitline, pg_dsn: str, schema: str) -> None:
    project_live(app, "a", "b")
    live = {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES}
    models = app.read_models()
    totals = {(t.state, t.currency): (t.payments, t.amount) for t in models.payment_totals()}
    assert sum(n for n, _ in totals.values()) == 60
    assert totals[("COMPLETED", "USD")] == (10, sum(Decimal(f"{n + 1}.25") for n in range(30) if n % 3 == 1
                                                    and n % 2) * 2)
    for name in PROJECTIONS:
        app.rebuild(name, batch_size=37)
    rebuilt = {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES}
    assert rebuilt == live
    assert all(rows for table, rows in live.items() if table != "rm_order_fulfilments")


def test_several_projections_rebuilt_reading_the_log_once(app: Commitline, pg_dsn: str, schema: str) -> None:
    project_live(app, "a")
    live = {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES}
    head = app.recorder.max_notification_id()
    scans: list[tuple[int, int]] = []  # (first id, through) of each scan of the log
    scan = app.recorder.scan_notifications

    def counted(first: int, limit: int, passed_over: list[str]) -> Scan:
        result = scan(first, limit, passed_over)
        scans.append((first, result.through))
        return result

    app.recorder.scan_notifications = counted  # type: ignore[method-assign]
    try:
        results = app.rebuild_many(list(PROJECTIONS), batch_size=37)
    finally:
        del app.recorder.scan_notifications
    assert [r.projection for r in results] == list(PROJECTIONS) and all(r.position == head for r in results)
    assert {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES} == live
    # every event was scanned once for all four projections
    assert sum(through - first + 1 for first, through in scans if through >= first) == head, scans
    assert [r for r in app.status().followers if r.name.endswith("@rebuild")] == []


def test_projector_killed_mid_batch_never_double_counts(app: Commitline, pg_dsn: str, schema: str) -> None:
    task_id = app.dispatch({"type": "create_survey_task", "title": "t"}, idempotency_key="t").aggregate_id
    app.dispatch({"type": "issue_survey_task", "task_id": str(task_id),
                  "user_ids": [f"u{n}" for n in range(3000)]}, idempotency_key="issue")
    run_at_once(8, lambda i: [app.dispatch({"type": "answer_survey_task", "task_id": str(task_id),
                                            "user_id": f"u{n}"}, idempotency_key=f"a{n}")
                              for n in range(i, 3000, 8)])
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "COMMITLINE_PROJECT_BATCH_SIZE": "40"}
    kills = 0
    for delay in (0.6, 0.9, 1.2, 0.7, 1.0):
        proc = subprocess.Popen([sys.executable, "-m", "commitline.cli", "project", "task_statuses"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(delay)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        kills += 1
    with projector(app, "task_statuses") as running:
        running.wait_until_at(app.recorder.max_notification_id())
    assert kills == 5
    assert app.read_models().task_counts(task_id) == {"PENDING": 0, "DONE": 3000}


def test_a_projection_at_position_0_never_counts_rows_another_history_left(
        app: Commitline, pg_dsn: str, schema: str, caplog: pytest.LogCaptureFixture) -> None:
    """A restore of a backup older than the projection drops its position but not its tables (pg_restore --clean
    drops only what the dump holds): its replay from the first event must not add to the rows left there."""
    project_live(app, "a")
    live = {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES}
    assert live["rm_inventory_levels"], "the workload moves stock: the table has rows to double"
    with psycopg.connect(pg_dsn) as conn:  # what such a restore leaves: the tables, and no position
        conn.execute(f"DELETE FROM {schema}.follower_positions WHERE name = ANY(%s)", (list(PROJECTIONS),))
    with caplog.at_level("WARNING", logger="commitline.projections.projector"):
        project_live(app)
    assert {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES} == live
    assert "tables held rows" in caplog.text and "inventory_levels" in caplog.text


def test_two_instances_one_works_the_other_waits(app: Commitline) -> None:
    mixed_workload(app, "x")
    with projector(app, "inventory_levels", owner="first") as first:
        first.wait_until_at(app.recorder.max_notification_id())
        with projector(app, "inventory_levels", owner="second") as second:
            mixed_workload(app, "y")
            first.wait_until_at(app.recorder.max_notification_id())
            wait_for(lambda: lease_sessions(app, "inventory_levels") == 2, "the second instance to try the lease")
            assert second.follower.metrics.events_applied == 0
            assert not second.follower.lease.held
        assert first.follower.metrics.events_applied == 2 * 9


def inject_orphan_payment_event(app: Commitline) -> int:
    """A PaymentSubmitted for a payment that was never created: the payment projection cannot apply it."""
    from datetime import datetime, timezone

    event = PaymentSubmitted(event_id=uuid4(), aggregate_id=uuid4(), version=1,
                             occurred_at=datetime.now(timezone.utc), attempt=1)
    return app.recorder.append([encode_event(event, "default")])[0]


def test_poison_event_stops_the_projection_until_an_operator_decides(app: Commitline) -> None:
    app.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "a"}, idempotency_key="1")
    poison_at = inject_orphan_payment_event(app)
    after = app.dispatch({"type": "create_payment", "amount": "2.00", "currency": "EUR", "account": "b"},
                         idempotency_key="2")
    with projector(app, "payment_states") as running:
        running.wait_until_at(poison_at - 1)
        wait_for(lambda: running.follower.metrics.poisoned_at is not None, "the projector to meet the poison")
        assert running.follower.metrics.position == poison_at - 1, "it must stop just before the poison event"
        statuses = app.status().followers
        (status,) = [s for s in statuses if s.name == "payment_states"]
        assert status.status == "failed" and status.position == poison_at - 1
        assert status.error["position"] == poison_at and status.error["event_type"] == "PaymentSubmitted"
        assert "LookupError" in status.error["message"]
        assert app.read_models().payment_state(after.aggregate_id) is None

        assert app.stopped_positions("payment_states") == [poison_at]  # what `projections retry --json` reports
        retry(app.datastore, "payment_states")  # same code, same event: it stops again
        wait_for(lambda: own_status(app, "payment_states") == ("failed", poison_at), "the retried event to fail again")
        assert running.follower.metrics.position == poison_at - 1
        with pytest.raises(InterventionRefused):
            skip(app.datastore, "payment_states", poison_at + 1, "wrong position")
        skip(app.datastore, "payment_states", poison_at, "orphan event from a bad import, ticket 42")
        running.wait_until_at(app.recorder.max_notification_id())
        assert app.stopped_positions("payment_states") == []
    assert app.read_models().payment_state(after.aggregate_id) == "CREATED"
    with psycopg.connect(app.settings.database_url.get_secret_value()) as conn:
        actions = conn.execute(f"SELECT action, position FROM {app.settings.schema_name}.follower_interventions "
                               "ORDER BY id").fetchall()
    assert actions == [("retry", poison_at), ("skip", poison_at)]


def test_readers_never_see_a_partial_view_during_rebuild(app: Commitline, pg_dsn: str, schema: str) -> None:
    task_ids = []
    for n in range(40):
        task = app.dispatch({"type": "create_survey_task", "title": f"t{n}"}, idempotency_key=f"t{n}").aggregate_id
        app.dispatch({"type": "issue_survey_task", "task_id": str(task), "user_ids": [f"u{i}" for i in range(100)]},
                     idempotency_key=f"i{n}")
        task_ids.append(task)
    with projector(app, "task_statuses") as running:
        running.wait_until_at(app.recorder.max_notification_id())
    # Make the live view differ from what a rebuild produces, so each is recognisable.
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"UPDATE {schema}.rm_task_statuses SET users = users + 1000 WHERE status = 'PENDING'")
    old_total, new_total = 40 * 1100, 40 * 100
    seen: Counter[int] = Counter()
    stop = threading.Event()

    def read() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while not stop.is_set():
                seen[conn.execute(f"SELECT coalesce(sum(users), 0) FROM {schema}.rm_task_statuses "
                                  "WHERE status = 'PENDING'").fetchone()[0]] += 1

    reader = threading.Thread(target=read)
    reader.start()
    try:
        app.rebuild("task_statuses", batch_size=1)
        wait_for(lambda: seen[new_total] > 0, "a reader to see the rebuilt view")
    finally:
        stop.set()
        reader.join(10)
    assert set(seen) == {old_total, new_total}, f"a reader saw a partial view: {sorted(seen)}"


def test_interrupted_rebuild_resumes(app: Commitline, pg_dsn: str, schema: str) -> None:
    mixed_workload(app, "r")
    calls = []

    def interrupt_once(position: int, head: int, applied: int) -> None:
        calls.append(position)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        app.rebuild("payment_states", batch_size=10, progress=interrupt_once)
    interrupted_at = calls[-1]
    result = app.rebuild("payment_states", batch_size=10)
    assert result.resumed_from == interrupted_at > 0
    with bootstrap(settings_for(pg_dsn, schema)) as other:
        with projector(other, "payment_states") as running:
            running.wait_until_at(other.recorder.max_notification_id())
    totals = app.read_models().payment_totals()
    assert sum(t.payments for t in totals) == 30


def test_rebuild_and_list_commands(app: Commitline, pg_dsn: str, schema: str) -> None:
    mixed_workload(app, "cli")
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "COMMITLINE_PROJECT_BATCH_SIZE": "20"}
    cli = [sys.executable, "-m", "commitline.cli"]
    rebuilt = subprocess.run([*cli, "projections", "rebuild", "payment_states"], env=env, capture_output=True,
                             text=True, timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt payment_states" in rebuilt.stdout and "swapped in atomically" in rebuilt.stdout
    progress = [line for line in rebuilt.stderr.splitlines() if line.startswith("rebuild payment_states:")]
    assert progress and "events/s" in progress[-1] and "ETA" in progress[-1]  # plain lines when not a terminal
    listed = subprocess.run([*cli, "projections", "list", "--json"], env=env, capture_output=True, text=True,
                            timeout=60)
    rows = {r["name"]: r for r in orjson.loads(listed.stdout)["projections"]}
    head = app.recorder.max_notification_id()
    assert rows["payment_states"]["position"] == head and rows["payment_states"]["lag_events"] == 0
    assert rows["task_statuses"]["status"] == "never run"
    assert app.read_models().payment_totals()
    unknown = subprocess.run([*cli, "projections", "rebuild", "nope"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert unknown.returncode != 0 and "unknown projection" in unknown.stderr
