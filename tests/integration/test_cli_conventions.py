"""The command line's conventions, as scripts rely on them: ``--version``; ``--json`` on every command that prints
a result; the usage saying where ``-k`` is required; ``sagas show`` naming the id it was given; ``serve``
exiting 0 when stopped with SIGTERM. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import httpx
import orjson

from commitline import __version__
from commitline.composition import Commitline
from tests.integration.http.conftest import free_port
from tests.support import wait_for


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def on(pg_dsn: str, schema: str) -> dict[str, str]:
    return {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}


def test_version_and_the_usage_of_dispatch() -> None:
    version = cli(dict(os.environ), "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"commitline {__version__}"
    usage = cli(dict(os.environ), "dispatch", "--help").stdout
    assert "commitline dispatch [-t TENANT] -k KEY COMMAND_JSON" in usage and "required with a JSON argument" in usage


def test_every_command_that_prints_a_result_prints_it_as_json(app: Commitline, pg_dsn: str, schema: str,
                                                              tmp_path: Path) -> None:
    env = on(pg_dsn, schema)
    created = app.dispatch({"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "a"},
                           idempotency_key="p-1")
    app.dispatch({"type": "submit_payment", "payment_id": str(created.aggregate_id)}, idempotency_key="p-2")
    payment = str(created.aggregate_id)
    outputs = {
        "audit state": cli(env, "audit", "state", payment, "--at-version", "1", "--json"),
        "audit diff": cli(env, "audit", "diff", payment, "--from", "0", "--to", "2", "--json"),
        "idempotency expire": cli(env, "idempotency", "expire", "--older-than-days", "30", "--dry-run", "--json"),
        "projections rebuild": cli(env, "projections", "rebuild", "payment_states", "--json"),
        "up": cli(env, "up", "--json"),  # a configured database: nothing to start, said as JSON too
        "down": cli(env, "down", "--json"),
    }
    for name, done in outputs.items():
        assert done.returncode == 0, (name, done.stderr)
        orjson.loads(done.stdout)  # one JSON document
    assert orjson.loads(outputs["audit state"].stdout)["version"] == 1
    assert orjson.loads(outputs["up"].stdout) == orjson.loads(outputs["down"].stdout) == {}
    assert orjson.loads(outputs["idempotency expire"].stdout) == {"would_delete": 0, "older_than_days": 30}
    (rebuilt,) = orjson.loads(outputs["projections rebuild"].stdout)
    assert rebuilt["projection"] == "payment_states" and rebuilt["position"] == 2
    refused = cli(env, "projections", "retry", "payment_states", "--json")  # nothing stopped: refused, as before
    assert refused.returncode == 1 and refused.stdout == ""


def test_publish_drain_json(app: Commitline, pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="s-1")
    env = {**on(pg_dsn, schema), "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "COMMITLINE_KAFKA_IDEMPOTENCE": "false",
           "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}."}
    done = cli(env, "publish", "--drain", "--json")
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == {"events_published": 1, "batches": 1, "position": 1,
                                         "stopped_at_poison": False, "store_went_back": False}


def test_sagas_show_names_the_id_it_was_given(app: Commitline, pg_dsn: str, schema: str) -> None:
    unknown = str(uuid4())
    done = cli(on(pg_dsn, schema), "sagas", "show", unknown)
    error = orjson.loads(done.stderr)
    assert done.returncode == 1 and error["details"]["aggregate_id"] == unknown, done.stderr  # not found: refused
    retried = cli(on(pg_dsn, schema), "sagas", "retry", unknown)  # named by the id given, as show does
    assert retried.returncode == 1 and orjson.loads(retried.stderr)["details"]["aggregate_id"] == unknown, \
        retried.stderr


def test_serve_with_one_worker_exits_0_when_stopped(pg_dsn: str, schema: str) -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "commitline.cli", "serve", "--port", str(port)],
                              env=on(pg_dsn, schema), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def answers() -> bool:
        assert server.poll() is None, server.stderr.read().decode()  # type: ignore[union-attr]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answers, "serve to answer", timeout=120)
    server.send_signal(signal.SIGTERM)
    assert server.wait(60) == 0
