"""``commitline status`` as a health check, against real processes: liveness comes from the advisory
locks PostgreSQL holds for live sessions, never from a row a killed process left behind. And the other
check, a follower process's own ``/healthz`` (its container's health): about the process only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import orjson
import psycopg
import pytest

from commitline.composition import Commitline
from commitline.infrastructure.followers.lease import Lease
from commitline.infrastructure.kafka.publisher import PUBLISHER
from tests.support import RUNNER
from tests.support import PROJECTIONS
from tests.integration.test_order_saga import Shop
from tests.integration.test_projections import inject_orphan_payment_event
from tests.integration.http.conftest import free_port
from tests.support import FollowerThread, wait_for

CLI = [sys.executable, "-m", "commitline.cli"]


def environment(pg_dsn: str, schema: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema, **extra}


def status(pg_dsn: str, schema: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "status", *args], env=environment(pg_dsn, schema, **extra), capture_output=True,
                          text=True, timeout=120)


def status_json(pg_dsn: str, schema: str, **extra: str) -> dict[str, Any]:
    out = status(pg_dsn, schema, "--json", **extra)
    assert out.returncode == 0, out.stderr[-3000:]
    return orjson.loads(out.stdout)


def follower(report: dict[str, Any], name: str) -> dict[str, Any]:
    (row,) = [f for f in report["followers"] if f["name"] == name]
    return row



def add_tasks(app: Commitline, n: int) -> None:
    for i in range(n):
        app.dispatch({"type": "create_survey_task", "title": f"t{i}"}, idempotency_key=f"task-{uuid4()}")


@pytest.fixture
def projector_process(pg_dsn: str, schema: str, tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Starts ``commitline project task_statuses`` processes; any still running at the end are killed."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / f"project-{len(started)}.log").open("wb")
        process = subprocess.Popen([*CLI, "project", "task_statuses"], env=environment(pg_dsn, schema),
                                   stdout=log, stderr=subprocess.STDOUT)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_a_fresh_store_lists_every_follower_as_never_run(pg_dsn: str, schema: str) -> None:
    report = status_json(pg_dsn, schema)
    names = [f["name"] for f in report["followers"]]
    assert names == [PUBLISHER, RUNNER, *sorted(PROJECTIONS)]
    assert {f["status"] for f in report["followers"]} == {"never run"}
    assert all(not f["alive"] and f["backend"] is None and f["updated_at"] is None for f in report["followers"])
    assert report["healthy"] is True and report["problems"] == [] and report["stuck_fulfilments"] == []

    everything = status(pg_dsn, schema, "--check")
    assert everything.returncode == 0, everything.stderr  # nothing runs, so nothing is broken
    n = len(names)
    assert everything.stdout.strip() == f"healthy: all {n} followers ({n} not running)"  # counted, not judged
    named = status(pg_dsn, schema, "--check", "publisher,task_statuses")
    assert named.returncode == 1  # named followers must be running
    lines = named.stderr.strip().splitlines()
    assert lines == [f"unhealthy: {PUBLISHER}: never run", "unhealthy: task_statuses: never run"]
    unknown = status(pg_dsn, schema, "--check", "task_statuses,nope")
    assert unknown.returncode == 2 and "unknown follower(s) nope" in unknown.stderr
    table = status(pg_dsn, schema)
    assert table.returncode == 0 and "never run" in table.stdout and "order-fulfilment" in table.stdout


def test_a_killed_projector_is_shown_dead_and_fails_the_check(app: Commitline, pg_dsn: str, schema: str,
                                                               projector_process: Callable[[], subprocess.Popen[bytes]]
                                                               ) -> None:
    add_tasks(app, 3)
    process = projector_process()

    def alive() -> dict[str, Any] | None:
        row = follower(status_json(pg_dsn, schema), "task_statuses")
        return row if row["alive"] and row["status"] == "running" and row["lag_events"] == 0 else None

    row = wait_for(alive, "the projector to own task_statuses and catch up")
    assert row["backend"]["application"] == "commitline task_statuses"
    assert row["owner"].endswith(f":{process.pid}") and row["last_moved_seconds"] >= 0
    healthy = status(pg_dsn, schema, "--check", "task_statuses")
    assert healthy.returncode == 0, healthy.stderr
    # the publisher never runs here: its events' wait, in seconds, grows with the test on a loaded machine
    patient = {"COMMITLINE_STATUS_MAX_LAG_S": "86400"}
    whole = status(pg_dsn, schema, "--check", **patient)
    assert whole.returncode == 0, whole.stderr

    process.send_signal(signal.SIGTERM)  # a clean stop is a deployment's choice, not a fault...
    assert process.wait(60) == 0
    stopped = follower(status_json(pg_dsn, schema), "task_statuses")
    assert (stopped["status"], stopped["alive"]) == ("stopped", False)
    whole = status(pg_dsn, schema, "--check", **patient)
    assert whole.returncode == 0, whole.stderr
    named = status(pg_dsn, schema, "--check", "task_statuses")  # ...unless the caller says it should run
    assert named.returncode == 1 and "unhealthy: task_statuses: stopped: not running" in named.stderr

    process = projector_process()
    row = wait_for(alive, "a new projector to own task_statuses")
    backend_pid = row["backend"]["pid"]
    process.send_signal(signal.SIGKILL)
    process.wait(30)

    def dead() -> dict[str, Any] | None:
        row = follower(status_json(pg_dsn, schema), "task_statuses")
        return row if row["status"] == "dead" else None

    row = wait_for(dead, "status to notice the killed projector")
    assert row["recorded_status"] == "running", "the row still says running: only the lock tells the truth"
    assert row["owner"].endswith(f":{process.pid}") and row["backend"] is None and not row["alive"]
    assert any("dead" in p for p in row["problems"])
    check = status(pg_dsn, schema, "--check")
    assert check.returncode == 1
    assert f"unhealthy: task_statuses: dead: no live session holds its lease (last owner {row['owner']}" \
        in check.stderr
    assert status(pg_dsn, schema, "--check", "payment_states").returncode == 1  # never run, and named
    as_json = status(pg_dsn, schema, "--check", "--json")
    assert as_json.returncode == 1
    report = orjson.loads(as_json.stdout)
    assert report["healthy"] is False and any(p.startswith("task_statuses: dead") for p in report["problems"])
    assert backend_pid not in {f["backend"]["pid"] for f in report["followers"] if f["backend"]}


def test_a_projection_stopped_at_a_poison_event_fails_the_check(app: Commitline, pg_dsn: str, schema: str) -> None:
    app.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "a"},
                 idempotency_key="1")
    poison_at = inject_orphan_payment_event(app)
    with FollowerThread(lambda: app.projector("payment_states", poll_interval=0.2)) as running:
        wait_for(lambda: running.follower.metrics.poisoned_at is not None, "the projector to meet the poison")
        check = status(pg_dsn, schema, "--check")
        assert check.returncode == 1
        assert f"unhealthy: payment_states: stopped at poison event {poison_at} (PaymentSubmitted):" in check.stderr
        assert "LookupError" in check.stderr
        row = follower(status_json(pg_dsn, schema), "payment_states")
        assert (row["status"], row["alive"], row["position"]) == ("failed", True, poison_at - 1)
    # With nobody attached it is still stopped there, waiting for an operator.
    assert status(pg_dsn, schema, "--check").returncode == 1


def test_a_stuck_saga_fails_the_check(app: Commitline, pg_dsn: str, schema: str) -> None:
    shop = Shop(app)
    order = shop.place("acct|capture-declines|void-fails")
    shop.run_until_done()
    with FollowerThread(lambda: app.projector("order_fulfilments", poll_interval=0.2)) as projector:
        projector.wait_until_at(app.recorder.max_notification_id())
    check = status(pg_dsn, schema, "--check")
    assert check.returncode == 1
    assert f"unhealthy: order {order}: fulfilment STUCK: charge: GatewayUnavailable" in check.stderr
    assert status(pg_dsn, schema, "--check", "sagas,order_fulfilments").returncode == 1
    assert status(pg_dsn, schema, "--check", "order_fulfilments").returncode == 1  # stopped, and named
    report = status_json(pg_dsn, schema)
    assert report["stuck_fulfilments"] == [str(order)] and not report["healthy"]


def test_a_live_follower_lagging_beyond_a_threshold_fails_the_check(app: Commitline, pg_dsn: str,
                                                                     schema: str) -> None:
    add_tasks(app, 3)
    # A live owner that does not move: it holds the lease, as a hung projector would, at position 0.
    lease = Lease(app.conninfo, schema, "task_statuses", owner="hung-projector")
    assert lease.try_acquire()
    try:
        row = follower(status_json(pg_dsn, schema), "task_statuses")
        assert (row["status"], row["owner"], row["lag_events"]) == ("running", "hung-projector", 3)
        assert row["backend"]["pid"] == lease.run(lambda conn: conn.info.backend_pid)
        assert status(pg_dsn, schema, "--check").returncode == 0  # within the default thresholds
        by_events = status(pg_dsn, schema, "--check", COMMITLINE_STATUS_MAX_LAG_EVENTS="2")
        assert by_events.returncode == 1
        assert "unhealthy: task_statuses: lagging by 3 events" in by_events.stderr

        def lagging_in_seconds() -> subprocess.CompletedProcess[str] | None:
            out = status(pg_dsn, schema, "--check", COMMITLINE_STATUS_MAX_LAG_S="0.5")
            return out if out.returncode == 1 else None

        by_seconds = wait_for(lagging_in_seconds, "the oldest unhandled event to be older than 0.5 s")
        assert "unhealthy: task_statuses: lagging by 3 events" in by_seconds.stderr
    finally:
        lease.release()
    assert follower(status_json(pg_dsn, schema), "task_statuses")["status"] == "stopped"
    stopped = status(pg_dsn, schema, "--check", COMMITLINE_STATUS_MAX_LAG_EVENTS="2")
    assert "task_statuses" not in stopped.stderr, "a stopped projection is a deployment's choice, lag or not"


def test_head_positions_and_lags_agree_while_commands_arrive(app: Commitline) -> None:
    """The head, each follower's position and its lag come from one snapshot of the store: read one by one while
    commands arrive, a projection's position was past the head read just before it, and one at the head showed a
    lag. Sampled while a writer keeps appending and a projector keeps up with it."""
    import threading

    writing = threading.Event()
    writing.set()

    def write() -> None:
        while writing.is_set():
            add_tasks(app, 1)

    writer = threading.Thread(target=write, name="status-test-writer", daemon=True)
    seen: list[tuple[int, int, int]] = []  # (head, position, lag) of the moving projection
    with FollowerThread(lambda: app.projector("task_statuses", poll_interval=0.005)) as projector:
        writer.start()
        try:
            def enough_samples() -> bool:
                report = app.status()
                for row in report.followers:
                    assert row.head == report.head, row
                    assert row.position <= report.head, (row.name, row.position, report.head)
                    assert row.lag_events <= report.head - row.position, (row.name, row.lag_events, report.head)
                    if row.position == report.head:
                        assert row.lag_events == 0, (row.name, row.position, row.lag_events)
                    if row.name == "task_statuses" and row.position > 0:
                        seen.append((report.head, row.position, row.lag_events))
                return len(seen) >= 100 and projector.follower.metrics.position > 0

            wait_for(enough_samples, "100 status samples while the projection moves", 120)
        finally:
            writing.clear()
            writer.join(60)
    assert len({head for head, _, _ in seen}) > 1, "the head never moved while the samples were taken"


def test_a_publisher_that_does_not_run_while_events_wait_is_a_problem(app: Commitline, pg_dsn: str,
                                                                      schema: str) -> None:
    add_tasks(app, 3)
    assert status(pg_dsn, schema, "--check").returncode == 0, "within the default thresholds"
    waiting = status(pg_dsn, schema, "--check", COMMITLINE_STATUS_MAX_LAG_EVENTS="2")
    assert waiting.returncode == 1
    assert waiting.stderr.startswith("unhealthy: kafka-publisher: never run while 3 events wait for it (the oldest ")
    assert waiting.stderr.count("unhealthy:") == 1, waiting.stderr
    report = status_json(pg_dsn, schema, COMMITLINE_STATUS_MAX_LAG_EVENTS="2")
    assert "never run while 3 events wait" in report["problems"][0]
    # and beside the follower itself, in JSON and in the table, not only in the list of problems
    assert [p[:32] for p in follower(report, "kafka-publisher")["problems"]] == ["never run while 3 events wait fo"]
    table = status(pg_dsn, schema, COMMITLINE_STATUS_MAX_LAG_EVENTS="2", COLUMNS="400").stdout
    (row,) = [line for line in table.splitlines() if " kafka-publisher " in line]
    assert "never run while 3 events wait for it" in row, table


def test_check_against_an_unreachable_store_exits_3(pg_dsn: str, schema: str) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = status(pg_dsn, schema, "--check",
                 COMMITLINE_DATABASE_URL=f"postgresql://someone:s3cret@127.0.0.1:{port}/nowhere")
    assert out.returncode == 3
    assert "store_unavailable" in out.stderr and "s3cret" not in out.stderr + out.stdout


def test_a_follower_process_is_healthy_while_it_runs_whatever_its_business_problems(
        app: Commitline, pg_dsn: str, schema: str, tmp_path: Path) -> None:
    """A container restarted for a STUCK saga or a poison event would be just as stuck after the restart:
    those fail ``status --check``, never the process's ``/healthz``, which fails when the process hangs."""
    order = Shop(app)
    stuck = order.place("acct|capture-declines|void-fails")
    order.run_until_done()
    poison_at = inject_orphan_payment_event(app)
    ports = {"project": free_port(), "sagas": free_port()}
    commands = {"project": ["project", "payment_states"], "sagas": ["sagas", "run"]}
    processes = {}
    for name, argv in commands.items():
        log = (tmp_path / f"{name}.log").open("wb")
        processes[name] = subprocess.Popen([*CLI, *argv, "--metrics-port", str(ports[name])],
                                           env=environment(pg_dsn, schema), stdout=log, stderr=subprocess.STDOUT)

    def health(name: str, timeout: float = 30) -> httpx.Response | None:
        assert processes[name].poll() is None, (tmp_path / f"{name}.log").read_text()
        try:
            return httpx.get(f"http://127.0.0.1:{ports[name]}/healthz", timeout=timeout)
        except httpx.TransportError:
            return None

    try:
        def both_problems() -> subprocess.CompletedProcess[str] | None:
            # the stuck saga shows once `sagas run` (started above, perhaps slowly on a busy machine) projected it
            out = status(pg_dsn, schema, "--check", "payment_states,sagas")
            seen = f"stopped at poison event {poison_at}" in out.stderr and f"order {stuck}: fulfilment STUCK" in out.stderr
            return out if seen else None

        check = wait_for(both_problems, "status --check to report the poison event and the STUCK saga")
        assert check.returncode == 1
        for name in processes:
            response = wait_for(lambda name=name: health(name), f"{name}'s /healthz to answer")
            assert (response.status_code, response.text) == (200, "ok\n"), name

        frozen = processes["project"]  # a hung process: nothing in it answers, and the check says so
        frozen.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(httpx.TimeoutException):
                httpx.get(f"http://127.0.0.1:{ports['project']}/healthz", timeout=2)
        finally:
            frozen.send_signal(signal.SIGCONT)
        response = wait_for(lambda: health("project"), "the resumed process's /healthz to answer")
        assert response.status_code == 200
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        for name, process in processes.items():
            try:
                assert process.wait(60) == 0, (tmp_path / f"{name}.log").read_text()
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()


def test_a_command_whose_answer_assures_refuses_a_schema_without_a_store_and_makes_none(pg_dsn: str) -> None:
    """A mistyped COMMITLINE_SCHEMA must not pass a health check, an audit, an erasure, a retention run or a
    rebuild as an empty store: each exits 3 naming the schema, and the schema is not made. ``status`` without
    ``--check`` shows the empty store it made, and says so."""
    typo = f"t_{uuid4().hex[:12]}"
    for args in (["status", "--check"], ["audit", "verify", "--all"], ["erase", "--tenant", "acme", "--subject", "c-1"],
                 ["idempotency", "expire", "--older-than-days", "7"], ["projections", "rebuild", "task_statuses"]):
        refused = subprocess.run([*CLI, *args], env=environment(pg_dsn, typo), capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode == 3, (args, refused.stdout, refused.stderr)
        assert f"schema {typo} holds no commitline store" in refused.stderr and "Traceback" not in refused.stderr, \
            (args, refused.stderr)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (typo,)).fetchone() == (0,)
    shown = status(pg_dsn, typo)  # showing a store is no assurance: an empty one is made, and said so
    assert shown.returncode == 0 and f"schema {typo} held no commitline store: an empty one was made now" in \
        shown.stderr, shown.stderr
    try:
        assert status(pg_dsn, typo, "--check").returncode == 0
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{typo}" CASCADE')


def test_a_pool_the_server_will_not_fill_is_reported_with_the_servers_own_refusal(pg_dsn: str, schema: str) -> None:
    """A role limited to fewer connections than COMMITLINE_POOL_SIZE: a long-running command (which keeps the
    pool's connections open) exits 3 with what PostgreSQL answered (too many connections), not only that the pool
    did not fill, and never with the password. A command that runs once keeps two, and so runs."""
    role = f"limited_{uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'sekrit-pw' CONNECTION LIMIT 3")
        conn.execute(f"GRANT CREATE ON DATABASE {conn.info.dbname} TO {role}")
    try:
        info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
        url = f"postgresql://{role}:sekrit-pw@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{info['dbname']}"
        out = subprocess.run([*CLI, "project"], capture_output=True, text=True, timeout=120, env={  # long-running
            **environment(url, f"{schema}_limited"), "COMMITLINE_POOL_SIZE": "5"})
        assert out.returncode == 3, out.stdout + out.stderr
        assert "too many connections" in out.stderr and "sekrit-pw" not in out.stdout + out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        once = subprocess.run([*CLI, "status", "--json"], capture_output=True, text=True, timeout=120, env={
            **environment(url, f"{schema}_limited"), "COMMITLINE_POOL_SIZE": "5"})
        assert once.returncode == 0, once.stderr
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}_limited" CASCADE')
            conn.execute(f"REVOKE CREATE ON DATABASE {conn.info.dbname} FROM {role}")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_a_long_running_process_that_made_the_store_warns_of_a_mistyped_schema(pg_dsn: str) -> None:
    """``project`` (as ``serve``, ``publish`` and ``sagas run``) on a schema holding no store makes an empty one and
    would run healthy beside the real store: it says so in its log, once, naming the schema."""
    typo = f"t_{uuid4().hex[:12]}"
    process = subprocess.Popen([*CLI, "project"], env=environment(pg_dsn, typo), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, process.kill)  # a process that never says it ends the read below (EOF)
    watchdog.start()
    try:
        assert process.stderr is not None
        said = ""
        for line in process.stderr:  # read until the warning, which comes before any follower starts
            said += line
            if "held no commitline store" in line:
                break
        assert f"WARNING commitline schema {typo} held no commitline store: an empty one was made now" in said, said
    finally:
        watchdog.cancel()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{typo}" CASCADE')
    with_store = subprocess.run([*CLI, "--log-level", "INFO", "migrate"], env=environment(pg_dsn, typo),
                                capture_output=True, text=True, timeout=120)
    assert with_store.returncode == 0 and "held no commitline store" not in with_store.stderr, with_store.stderr
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{typo}" CASCADE')
