"""PostgreSQL stops for two minutes under a running fleet of real processes (``serve``, two ``publish``,
``project``, ``sagas run``) and load over HTTP, then comes back on the same data and port: every process
recovers by itself, each follower logs the outage once as it starts and once as it ends, nothing acknowledged
is lost, a retry with its key applies once, Kafka holds every stored event in order, the read models equal a
recount and the audit verifies.

The outage lasts ``COMMITLINE_TEST_OUTAGE_S`` seconds (default 120: the suite runs the full two minutes).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import psycopg
import pytest

from commitline.composition import bootstrap
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from tests.fleet import (Fleet, Load, check_applied_once, check_kafka, check_outage_logged_once, fleet_env,
                         published_beyond, read_kafka, stored_events)
from tests.fleet_workload import (SETTLED, TENANT, Workload, all_running, caught_up, check_each_applied_once,
                                  check_read_models, start_fleet)
from tests.support import settings_for, wait_for

pytestmark = pytest.mark.integration

OUTAGE_S = float(os.environ.get("COMMITLINE_TEST_OUTAGE_S", "120"))
SCHEMA = "fleet"
FOLLOWER_PROCESSES = ("publish-1", "publish-2", "project", "sagas")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(tmp_path / "pg")  # its own server: the session-wide one must never stop
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.mark.timeout(OUTAGE_S + 900)
def test_a_two_minute_outage_under_load_loses_nothing_and_every_process_recovers_by_itself(
        server: EmbeddedPostgres, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = fleet_env(server.dsn, SCHEMA, kafka_bootstrap)
    work = Workload(threads=3)
    with Fleet(env, tmp_path / "logs") as fleet, ExitStack() as stack:
        key = start_fleet(fleet)
        app = stack.enter_context(bootstrap(settings_for(server.dsn, SCHEMA)))
        wait_for(lambda: all_running(app), "every follower to run", timeout=180)
        with Load(fleet.base_url, key, work, threads=3) as load:
            load.wait_acked(60, "the load to run")
            server.stop()
            stopped = time.monotonic()
            wait_for(lambda: fleet.ready() == 503, "/readyz to answer 503", timeout=60)
            # callers, with a key or none, learn that PostgreSQL is away, not where it is nor as whom
            answers = [httpx.get(f"{fleet.base_url}/readyz", timeout=30),
                       httpx.post(f"{fleet.base_url}/v1/commands", timeout=30, json={
                           "type": "receive_stock", "item_id": str(uuid.uuid4()), "quantity": 1},
                           headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "during-the-outage"})]
            for answer in answers:
                assert answer.status_code == 503 and "the server's log names the cause" in answer.text, answer.text
                assert "cannot use PostgreSQL" not in answer.text and "127.0.0.1" not in answer.text, answer.text
            wait_for(lambda: fleet.cli("status").returncode == 3, "commitline status to exit 3", timeout=60)
            refused = len(load.failed())
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))  # the outage itself
            assert len(load.failed()) > refused, "commands kept being refused during the outage"
            server.start()
            restarted = time.monotonic()
            with psycopg.connect(server.dsn) as conn:  # everything stored before the outage
                [(head,)] = conn.execute(f"SELECT max(notification_id) FROM {SCHEMA}.events").fetchall()
            wait_for(lambda: fleet.ready() == 200, "serve to be ready again", timeout=120)
            said = [line for line in fleet.processes["serve"].output().splitlines() if "ready" in line]
            assert any("not ready: database unreachable: cannot use PostgreSQL at" in line for line in said) and \
                "ready again" in said[-1], said  # in serve's log, not only in the 503s
            assert not any("event store unavailable" in line for line in said), said  # described once
            told = [line for line in fleet.processes["serve"].output().splitlines()
                    if "answering 503 store_unavailable: cannot use PostgreSQL at" in line]
            assert 1 <= len(told) <= 10 < len(load.failed()), told  # in the log once per cause, not per request
            wait_for(lambda: published_beyond(server.dsn, SCHEMA, head), "an event stored after the outage to be "
                     "published", timeout=180)
            published = time.monotonic()
            load.wait_acked(30, "commands to be acknowledged again")
            accepted = min(s.acked_at for s in load.acked() if s.acked_at > restarted)
        retried = load.retry_failed()
        sent = list(load.sent.values())

        wait_for(lambda: caught_up(app), "every follower and bucket to reach the head", timeout=300)
        orders = [uuid.UUID(s.command["order_id"]) for s in sent if s.command["type"] == "place_order"]
        wait_for(lambda: all((f := app.read_models().fulfilment(o, TENANT)) and f.state in SETTLED
                             for o in orders), "every order's fulfilment to settle", timeout=300)
        wait_for(lambda: caught_up(app), "every follower to reach the head after the sagas", timeout=300)
        check_applied_once(server.dsn, SCHEMA, TENANT, sent)
        check_each_applied_once(server.dsn, SCHEMA, sent)
        duplicates = check_kafka(stored_events(server.dsn, SCHEMA), read_kafka(kafka_bootstrap, f"{SCHEMA}."))
        check_read_models(app, server.dsn, SCHEMA, work)
        assert not app.read_models().fulfilments(stuck_only=True)

        verified = fleet.cli("audit", "verify", "--all")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        for name in FOLLOWER_PROCESSES:
            check_outage_logged_once(name, fleet.processes[name].output, SCHEMA)
        codes = fleet.stop()
    assert codes == dict.fromkeys(codes, 0), codes
    for process in fleet.processes.values():
        assert "Traceback" not in process.output(), process.output()[-5000:]
    with capsys.disabled():
        print(f"\n[outage {OUTAGE_S:.0f} s] {len(sent)} commands, {retried} retried with their key, "
              f"{duplicates} duplicates in Kafka; after the restart: first command accepted {accepted - restarted:.1f} s, "
              f"first event stored after it published {published - restarted:.1f} s (at most)")
