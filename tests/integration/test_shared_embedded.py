"""The embedded PostgreSQL of a data folder is shared: the first process starts it, the others reuse
it, none stops it under another, the last one out stops it (unless ``commitline up`` pinned it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest

from commitline.composition import bootstrap
from commitline.infrastructure.config import Settings
from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from tests.support import read_topics, wait_for

PROCESS_TIMEOUT = 120


def env_for(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMITLINE_", "KAFKA_"))}
    return {**env, "COMMITLINE_DATA_DIR": str(data_dir)}


def commitline(data_dir: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], env=env_for(data_dir), input=stdin,
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT)


def start(data_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "commitline.cli", *args], env=env_for(data_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)



def server_of(data_dir: Path) -> EmbeddedPostgres | None:
    return EmbeddedPostgres.running(data_dir / "postgres")


def postmaster_pid(data_dir: Path) -> int | None:
    server = server_of(data_dir)
    return server.pid if server else None


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "data"
    yield folder
    try:
        server = server_of(folder)
    except EmbeddedServiceError:  # the folder made incompatible on purpose: nothing runs there
        return
    if server is not None:  # whatever a failed test left running
        server.stop()


def test_a_second_process_reuses_the_server_and_the_last_one_out_stops_it(data_dir: Path) -> None:
    projector = start(data_dir, "project", "task_statuses")
    try:
        wait_for(lambda: postmaster_pid(data_dir) is not None, "the projector started the server")
        first = postmaster_pid(data_dir)
        for args, stdin in ((("status",), None), (("dispatch", "-k", "t1", '{"type":"create_survey_task","title":"t"}'),
                                                   None), (("dispatch",), '{"type":"create_survey_task","title":"u"}\n')):
            done = commitline(data_dir, *args, stdin=stdin)
            assert done.returncode == 0, done.stderr[-3000:]
            assert "stopping it" not in done.stderr
        assert projector.poll() is None, projector.stderr.read()[-3000:]  # type: ignore[union-attr]
        assert postmaster_pid(data_dir) == first, "the server was restarted under the projector"
    finally:
        projector.send_signal(signal.SIGTERM)
        _, stderr = projector.communicate(timeout=PROCESS_TIMEOUT)
    assert projector.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "AdminShutdown" not in stderr
    assert server_of(data_dir) is None, "the last process out leaves the server running"


def test_a_killed_starter_leaves_the_server_to_the_others(data_dir: Path) -> None:
    starter = start(data_dir, "project", "task_statuses")
    wait_for(lambda: postmaster_pid(data_dir) is not None, "the first process started the server")
    with bootstrap(Settings(data_dir=data_dir)) as app:
        starter.send_signal(signal.SIGKILL)
        starter.wait(30)
        result = app.dispatch({"type": "create_survey_task", "title": "after the kill"}, idempotency_key="k")
        assert result.version == 1
        assert server_of(data_dir) is not None
    assert server_of(data_dir) is None


def test_two_apps_in_one_process_share_the_server(data_dir: Path) -> None:
    first = bootstrap(Settings(data_dir=data_dir))
    with bootstrap(Settings(data_dir=data_dir)) as second:
        assert second.embedded_postgres is not None and first.embedded_postgres is not None
        assert second.embedded_postgres.port == first.embedded_postgres.port
        first.close()
        assert second.dispatch({"type": "create_survey_task", "title": "t"}, idempotency_key="k").version == 1
    assert server_of(data_dir) is None


def test_up_keeps_the_server_running_and_down_stops_it_when_unused(data_dir: Path) -> None:
    up = commitline(data_dir, "up")
    assert up.returncode == 0 and "PostgreSQL started" in up.stdout, up.stderr[-3000:]
    pid = postmaster_pid(data_dir)
    assert commitline(data_dir, "status").returncode == 0
    assert postmaster_pid(data_dir) == pid, "a command run after `up` restarted or stopped the server"
    assert "already running" in commitline(data_dir, "up").stdout

    projector = start(data_dir, "project", "task_statuses")
    try:
        wait_for(lambda: projector.poll() is None and _lease_taken(data_dir), "the projector runs")
        refused = commitline(data_dir, "down")
        assert refused.returncode == 1 and "postgres: in use" in refused.stdout and "--force" in refused.stderr
        assert postmaster_pid(data_dir) == pid
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.communicate(timeout=PROCESS_TIMEOUT)
    assert server_of(data_dir) is None, "`down` unpinned it: the projector, its last user, stops it"
    assert "not running" in commitline(data_dir, "down").stdout


def _lease_taken(data_dir: Path) -> bool:
    server = server_of(data_dir)
    if server is None:
        return False
    import psycopg

    with psycopg.connect(server.dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted").fetchone()
    return bool(row and row[0])


def test_a_data_folder_of_another_postgresql_version_is_refused(data_dir: Path) -> None:
    cluster = data_dir / "postgres"
    cluster.mkdir(parents=True)
    (cluster / "PG_VERSION").write_text("15\n")
    refused = commitline(data_dir, "status")
    assert refused.returncode == 3
    assert "COMMITLINE_DATA_DIR" in refused.stderr and "PostgreSQL 15" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_embedded_broker_is_shared_and_a_new_one_gets_every_event_again(data_dir: Path) -> None:
    up = commitline(data_dir, "up", "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    broker = json.loads(up.stdout)["kafka"]["at"]
    try:
        assert commitline(data_dir, "dispatch", "-k", "t1", '{"type":"create_survey_task","title":"t"}').returncode == 0
        drained = commitline(data_dir, "publish", "--drain")
        assert drained.returncode == 0, drained.stderr[-3000:]
        assert json.loads(commitline(data_dir, "up", "--json").stdout)["kafka"] == {"state": "already running",
                                                                                     "at": broker}
        assert [r.envelope["type"] for r in read_topics(broker, "commitline.", 1)] == ["SurveyTaskCreated"]

        assert commitline(data_dir, "down").returncode == 0  # the broker's records are gone with it
        renewed = json.loads(commitline(data_dir, "up", "--json").stdout)["kafka"]["at"]
        again = commitline(data_dir, "publish", "--drain")
        assert again.returncode == 0, again.stderr[-3000:]
        assert "publishing again from the first event" in again.stderr
        assert [r.envelope["type"] for r in read_topics(renewed, "commitline.", 1)] == ["SurveyTaskCreated"]
    finally:
        commitline(data_dir, "down", "--force")


def test_two_demos_at_once_share_the_services_and_both_succeed(data_dir: Path) -> None:
    demos = [start(data_dir, "demo") for _ in range(2)]
    outcomes = [demo.communicate(timeout=600) for demo in demos]
    for demo, (stdout, stderr) in zip(demos, outcomes):
        assert demo.returncode == 0, stderr[-3000:]
        assert "Traceback" not in stderr and "stopping it" not in stderr
        assert "audit verify --all: OK" in stdout
    assert server_of(data_dir) is None, "the last demo out leaves the server running"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_reconnects_by_itself_after_the_database_restarts(data_dir: Path, workers: str) -> None:
    import time

    import httpx

    from tests.integration.http.conftest import free_port

    port = free_port()
    server = start(data_dir, "serve", "--port", str(port), "--workers", workers, "--no-access-log")
    base = f"http://127.0.0.1:{port}"

    def ready() -> int:
        assert server.poll() is None, server.stderr.read()  # type: ignore[union-attr]
        try:
            return httpx.get(f"{base}/readyz", timeout=5).status_code
        except httpx.TransportError:
            return 0

    try:
        wait_for(lambda: ready() == 200, "serve to be ready", timeout=120)
        down = commitline(data_dir, "down", "--force")
        assert down.returncode == 0, down.stderr
        began = time.monotonic()
        assert ready() == 503 and time.monotonic() - began < 1.5, "the probe answers within a second"
        up = commitline(data_dir, "up")
        assert up.returncode == 0, up.stderr
        wait_for(lambda: all(ready() == 200 for _ in range(6)), "every worker to reconnect", timeout=30)
        key = commitline(data_dir, "tenants", "add", "acme").stdout.strip()
        placed = httpx.post(f"{base}/v1/commands", json={"type": "receive_stock", "item_id": str(uuid4()),
                                                           "quantity": 1},
                            headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "after-restart"}, timeout=60)
        assert placed.status_code == 201, placed.text
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        commitline(data_dir, "down", "--force")
