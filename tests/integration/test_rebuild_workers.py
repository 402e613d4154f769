"""Projections rebuilt in several processes (``rebuild_many(..., jobs=N)``, ``projections rebuild --all --jobs
N``): the same read models as one process builds, a worker's poison event reported with the command that passes
it while the other group's rebuild stands, and an interrupt that stops every worker and resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from uuid import UUID, uuid4

import orjson
import pytest

import commitline.composition.projections as composition_projections
from commitline import Domain
from commitline.composition import Commitline, bootstrap
from commitline.examples import inventory, payments
from commitline.composition.rebuild_workers import split
from commitline.examples.inventory import StockReceived
from commitline.examples.payments import PaymentCreated
from commitline.infrastructure.store.codec import encode_event
from commitline.projections.rebuild import RebuildError, rebuild_name
from tests.integration.test_projections import (
    ALL_TABLES,
    inject_orphan_payment_event,
    project_live,
    table_rows,
)
from tests.support import PROJECTIONS, settings_for, wait_for


def groups_of(app: Commitline, jobs: int = 2) -> list[list[str]]:
    """The split ``rebuild_many`` makes: the first group stays in this process."""
    counts = app.recorder.topic_counts()
    return split({n: sum(counts.get(t, 0) for t in app.projection(n).handled_topics()) for n in PROJECTIONS}, jobs)


def test_projections_rebuilt_in_two_processes_equal_the_live_view(app: Commitline, pg_dsn: str, schema: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    project_live(app, "a")
    live = {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES}
    head = app.recorder.max_notification_id()
    in_process: list[list[str]] = []
    one_process = composition_projections.rebuild_many

    def recorded(projections, *args, **kwargs):  # type: ignore[no-untyped-def]
        in_process.append([p.name for p in projections])
        return one_process(projections, *args, **kwargs)

    monkeypatch.setattr(composition_projections, "rebuild_many", recorded)
    started: list[str] = []
    # the worker is forked, with the settings in memory: no command line (or environment, or pipe) carries them
    monkeypatch.setattr(subprocess, "Popen", lambda args, *rest, **kwargs: started.append(str(args)))
    reports: list[tuple[int, int, int]] = []
    results = app.rebuild_many(list(PROJECTIONS), batch_size=37, jobs=2, progress=lambda *r: reports.append(r))

    assert [r.projection for r in results] == list(PROJECTIONS) and all(r.position == head for r in results)
    assert {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES} == live
    # this process rebuilt its own group only: the others were rebuilt by a worker process
    assert len(in_process) == 1 and 0 < len(in_process[0]) < len(PROJECTIONS), in_process
    assert sorted(in_process[0]) == groups_of(app)[0]
    assert reports and reports[-1][0] == head and reports[-1][2] == sum(r.events_applied for r in results)
    assert [r for r in app.status().followers if r.name.endswith("@rebuild")] == []
    assert started == []


def test_a_domain_built_in_python_rebuilds_in_two_processes(pg_dsn: str, schema: str) -> None:
    """A domain the program builds (not importable as ``module:attribute``): the worker is forked with it."""
    built_here = Domain("built_here", include=[payments.domain, inventory.domain])
    with bootstrap(settings_for(pg_dsn, schema), domain=built_here) as app:
        fill(app, streams=30, length=4)
        head = app.recorder.max_notification_id()
        tables = [t.name for name in ("inventory_levels", "payment_states") for t in app.projection(name).tables]
        results = app.rebuild_many([], jobs=2)
        assert {r.projection: r.position for r in results} == {"inventory_levels": head, "payment_states": head}
        in_two = {table: table_rows(pg_dsn, schema, table) for table in tables}
        assert all(in_two.values()), in_two
        app.rebuild_many([], jobs=1, fresh=True)
        assert {table: table_rows(pg_dsn, schema, table) for table in tables} == in_two


def test_a_process_per_projection_builds_what_one_process_builds(app: Commitline, pg_dsn: str, schema: str) -> None:
    """Four groups: three workers, each forked before any of them is listened to."""
    project_live(app, "a")
    head = app.recorder.max_notification_id()
    results = app.rebuild_many(list(PROJECTIONS), batch_size=23, jobs=4)
    assert {r.projection: r.position for r in results} == dict.fromkeys(PROJECTIONS, head)
    in_four = {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES}
    app.rebuild_many(list(PROJECTIONS), jobs=1, fresh=True)
    assert {table: table_rows(pg_dsn, schema, table) for table in ALL_TABLES} == in_four


def test_a_worker_s_poison_event_is_reported_and_the_other_group_still_swapped_in(app: Commitline) -> None:
    task = app.dispatch({"type": "create_survey_task", "title": "t"}, idempotency_key="t").aggregate_id
    app.dispatch({"type": "issue_survey_task", "task_id": str(task), "user_ids": [f"u{n}" for n in range(40)]},
                 idempotency_key="issue")
    for n in range(40):  # survey events outweigh payments: task_statuses stays here, payment_states goes to a worker
        app.dispatch({"type": "answer_survey_task", "task_id": str(task), "user_id": f"u{n}"},
                     idempotency_key=f"answer-{n}")
    app.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "a"}, idempotency_key="p")
    poison_at = inject_orphan_payment_event(app)
    head = app.recorder.max_notification_id()
    groups = groups_of(app)
    assert "task_statuses" in groups[0] and "payment_states" not in groups[0], groups

    with pytest.raises(RebuildError) as stopped:
        app.rebuild_many(list(PROJECTIONS), jobs=2)
    message = str(stopped.value)
    assert f"commitline projections rebuild payment_states --skip {poison_at}" in message
    assert "rebuilt and swapped in meanwhile" in message and "task_statuses" in message
    assert app.read_models().task_counts(task) == {"PENDING": 0, "DONE": 40}
    positions = {r.name: r.position for r in app.status().followers}
    assert positions["task_statuses"] == head and "task_statuses@rebuild" not in positions
    assert positions[rebuild_name("payment_states")] == poison_at - 1  # kept, to resume once decided


def test_a_poison_event_in_the_command_s_own_group_leaves_the_workers_groups_swapped_in(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    """Through the command line: one line on stderr naming both the command that passes the event and what
    was rebuilt meanwhile, exit 1 (a refusal), never a traceback."""
    for n in range(40):  # payments outweigh the rest: payment_states is rebuilt by the command's own process
        app.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": f"a{n}"},
                     idempotency_key=f"p{n}")
    task = app.dispatch({"type": "create_survey_task", "title": "t"}, idempotency_key="t").aggregate_id
    app.dispatch({"type": "issue_survey_task", "task_id": str(task), "user_ids": ["u1", "u2"]}, idempotency_key="i")
    app.dispatch({"type": "answer_survey_task", "task_id": str(task), "user_id": "u1"}, idempotency_key="a")
    poison_at = inject_orphan_payment_event(app)
    head = app.recorder.max_notification_id()
    groups = groups_of(app)
    assert "payment_states" in groups[0] and "task_statuses" not in groups[0], groups

    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    done = subprocess.run([sys.executable, "-m", "commitline.cli", "projections", "rebuild", "--all", "--jobs", "2"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr[-3000:]
    assert f"commitline projections rebuild payment_states --skip {poison_at}" in done.stderr
    assert "rebuilt and swapped in meanwhile" in done.stderr and "task_statuses" in done.stderr
    assert app.read_models().task_counts(task) == {"PENDING": 1, "DONE": 1}
    positions = {r.name: r.position for r in app.status().followers}
    assert positions["task_statuses"] == head and "task_statuses@rebuild" not in positions
    assert 40 <= positions[rebuild_name("payment_states")] < poison_at  # kept, to resume once decided


def test_a_worker_runs_the_commitline_its_command_runs_whatever_the_working_directory_holds(
        app: Commitline, pg_dsn: str, schema: str, tmp_path: Path) -> None:
    fill(app, streams=20, length=5)
    head = app.recorder.max_notification_id()
    impostor = tmp_path / "commitline"  # another checkout where the command is run
    impostor.mkdir()
    (impostor / "__init__.py").write_text("raise ImportError('the commitline of the working directory')\n")
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    # as an operator runs it: the installed script (its own commitline), the working directory on the path too
    done = subprocess.run([str(Path(sys.executable).parent / "commitline"), "projections", "rebuild", "--all",
                           "--jobs", "2", "--json"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "working directory" not in done.stderr
    assert {r["projection"]: r["position"] for r in orjson.loads(done.stdout)} == dict.fromkeys(PROJECTIONS, head)


def workers_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def fill(app: Commitline, streams: int, length: int) -> list[UUID]:
    """``streams`` payments and as many stock items of ``length`` events each, written straight to the log."""
    at = datetime.now(timezone.utc)
    items = [uuid4() for _ in range(streams)]
    stored = [encode_event(PaymentCreated(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=at,
                                          amount=Decimal("1.00"), currency="EUR", account=f"a{n}"), "default")
              for n in range(streams * length)]
    stored += [encode_event(StockReceived(event_id=uuid4(), aggregate_id=item, version=v, occurred_at=at, quantity=1),
                            "default") for v in range(1, length + 1) for item in items]
    for start in range(0, len(stored), 2000):
        app.recorder.append(stored[start:start + 2000])
    return items


def test_an_interrupted_rebuild_in_processes_stops_every_worker_and_resumes(app: Commitline, pg_dsn: str,
                                                                              schema: str) -> None:
    items = fill(app, streams=300, length=20)  # 6,000 payments and 6,000 stock events, in batches of 5
    head = app.recorder.max_notification_id()
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "COMMITLINE_PROJECT_BATCH_SIZE": "5"}
    cli = [sys.executable, "-m", "commitline.cli", "projections", "rebuild", "--all", "--jobs", "2"]
    running = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def rebuilding() -> set[str]:
        return {r.name for r in app.status().followers if r.name.endswith("@rebuild") and r.position}

    try:
        wait_for(lambda: {"payment_states@rebuild", "inventory_levels@rebuild"} <= rebuilding(),
                 "both groups to be under way", timeout=60)
        workers = workers_of(running.pid)
        assert workers, "the worker process must be running"
        running.send_signal(signal.SIGINT)
        out, err = running.communicate(timeout=90)
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 130, err[-3000:]
    assert "interrupted" in err and "Run it again to resume" in err
    assert all(not Path(f"/proc/{pid}").exists() for pid in workers), "a worker outlived the interrupted rebuild"
    stopped_at = {r.name: r.position for r in app.status().followers if r.name.endswith("@rebuild")}
    # both groups stopped part-way, the worker's too (had it been left to finish, its rebuild would be swapped in)
    assert {"payment_states@rebuild", "inventory_levels@rebuild"} <= set(stopped_at), stopped_at
    assert all(p < head for p in stopped_at.values()), stopped_at

    again = subprocess.run([*cli, "--json"], env={**env, "COMMITLINE_PROJECT_BATCH_SIZE": "500"},
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    results = {r["projection"]: r for r in orjson.loads(again.stdout)}
    assert set(results) == set(PROJECTIONS) and all(r["position"] == head for r in results.values())
    assert any(r["resumed_from"] > 0 for r in results.values())
    assert [r for r in app.status().followers if r.name.endswith("@rebuild")] == []
    assert {app.read_models().inventory_level(item).on_hand for item in items} == {20}  # type: ignore[union-attr]


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_worker_whose_parent_is_killed_stops_rebuilding(app: Commitline, pg_dsn: str, schema: str,
                                                          sigint: str) -> None:
    """``ignored``: started as a background job of a script (``cmd &`` in a non-interactive shell), the command
    and its workers inherit SIGINT ignored; the worker's interruption must not depend on it."""
    fill(app, streams=300, length=20)
    head = app.recorder.max_notification_id()
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "COMMITLINE_PROJECT_BATCH_SIZE": "5"}
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" else None
    running = subprocess.Popen([sys.executable, "-m", "commitline.cli", "projections", "rebuild", "--all", "--jobs",
                                "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=ignore)
    try:
        wait_for(lambda: any(r.name == "payment_states@rebuild" and r.position for r in app.status().followers),
                 "the worker's rebuild to be under way", timeout=60)
        (worker,) = workers_of(running.pid)
    finally:
        running.kill()
        running.wait(30)
    wait_for(lambda: not Path(f"/proc/{worker}").exists() or "Z" in _state(worker),
             "the orphaned worker to stop", timeout=60)
    rows = [r for r in app.status().followers if r.name == "payment_states@rebuild"]
    assert rows, "the orphaned worker finished its rebuild and swapped it in"
    assert rows[0].position < head  # it stopped where it was: running the rebuild again resumes from there


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2:].split()[0]
