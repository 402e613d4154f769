"""Failover to a synchronous standby under a running fleet of real processes and load over HTTP.

Two PostgreSQL servers: a primary, and a standby made with ``pg_basebackup -R`` that streams from it and
acknowledges every commit (``synchronous_standby_names = '*'``, set once it streams). Every process is given
both in one libpq URL with ``target_session_attrs=read-write``. The primary is SIGKILLed under load, the
standby promoted and its ``synchronous_standby_names`` cleared, as docs/guides/failover.md says: every command
acknowledged before the kill is on the new primary, the unacknowledged ones retried with their key apply once,
no follower skips an event, each logs the failover as one outage, and the audit verifies.

Marked ``failover`` so that it can be run alone, e.g. three times in a row:
``for i in 1 2 3; do pytest -m failover tests/integration/test_fleet_failover.py || break; done``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from commitline.composition import bootstrap
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from tests.fleet import (Fleet, Load, check_applied_once, check_kafka, check_outage_logged_once, fleet_env,
                         published_beyond, read_kafka, stored_events)
from tests.fleet_workload import (SETTLED, TENANT, Workload, all_running, caught_up, check_each_applied_once,
                                  check_read_models, start_fleet)
from tests.standby import DATABASE, fleet_url, primary_and_standby, promote, sql
from tests.support import settings_for, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.failover]

SCHEMA = "failover"


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    with primary_and_standby(tmp_path, synchronous=True) as both:
        yield both


@pytest.mark.timeout(1200)
def test_failover_to_a_synchronous_standby_under_load_loses_nothing_acknowledged_and_skips_nothing(
        servers: tuple[EmbeddedPostgres, EmbeddedPostgres], kafka_bootstrap: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    primary, standby = servers
    url = fleet_url(primary, standby)
    work = Workload(threads=3)
    with Fleet(fleet_env(url, SCHEMA, kafka_bootstrap), tmp_path / "logs") as fleet, ExitStack() as stack:
        key = start_fleet(fleet)
        app = stack.enter_context(bootstrap(settings_for(url, SCHEMA, pool_timeout_s=2)))
        wait_for(lambda: all_running(app), "every follower to run", timeout=180)
        with Load(fleet.base_url, key, work, threads=3) as load:
            load.wait_acked(60, "the load to run")
            killed_at = time.monotonic()
            primary.kill()
            before = [s for s in load.acked() if s.acked_at < killed_at]
            # the promotion waits until a command was refused, as an orchestrator's takes seconds
            wait_for(lambda: [s for s in load.failed() if s.failures], "a command refused without a primary", 60)
            promoting = time.monotonic()  # no primary since the kill: every answer from here on is the new one's
            promote(standby)
            promoted = time.monotonic()
            head_at_promotion = sql(standby, f"SELECT max(notification_id) FROM {SCHEMA}.events", DATABASE)[0][0]
            wait_for(lambda: published_beyond(standby.dsn, SCHEMA, head_at_promotion), "the publisher to publish an event "
                     "stored on the new primary", timeout=180)
            first_published = time.monotonic()
            on_new_primary = lambda: [s for s in load.acked() if s.acked_at > promoting]  # noqa: E731
            wait_for(on_new_primary, "a command accepted on the new primary", timeout=180)
            first_accepted = min(s.acked_at for s in on_new_primary())
            load.wait_acked(30, "the load to go on against the new primary")
        check_applied_once(standby.dsn, SCHEMA, TENANT, before)  # acknowledged before the kill: on the new primary
        retried = load.retry_failed()
        sent = list(load.sent.values())

        wait_for(lambda: caught_up(app), "every follower and bucket to reach the head", timeout=300)
        orders = [uuid.UUID(s.command["order_id"]) for s in sent if s.command["type"] == "place_order"]
        wait_for(lambda: all((f := app.read_models().fulfilment(o, TENANT)) and f.state in SETTLED
                             for o in orders), "every order's fulfilment to settle", timeout=300)
        wait_for(lambda: caught_up(app), "every follower to reach the head after the sagas", timeout=300)
        check_applied_once(standby.dsn, SCHEMA, TENANT, sent)
        check_each_applied_once(standby.dsn, SCHEMA, sent)
        records = read_kafka(kafka_bootstrap, f"{SCHEMA}.")
        duplicates = check_kafka(stored_events(standby.dsn, SCHEMA), records)
        check_read_models(app, standby.dsn, SCHEMA, work)
        assert not app.read_models().fulfilments(stuck_only=True)
        verified = fleet.cli("audit", "verify", "--all")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        for name in ("publish-1", "publish-2", "project", "sagas"):
            check_outage_logged_once(name, fleet.processes[name].output, SCHEMA)
        codes = fleet.stop()
    assert codes == dict.fromkeys(codes, 0), codes
    for process in fleet.processes.values():
        assert "Traceback" not in process.output(), process.output()[-5000:]
    with capsys.disabled():
        print(f"\n[failover] {len(sent)} commands ({len(before)} acknowledged before the kill), {retried} retried "
              f"with their key, {duplicates} duplicates in Kafka; from the kill: promoted after {promoted - killed_at:.1f} s, "
              f"first command accepted on the new primary {first_accepted - killed_at:.1f} s "
              f"({first_accepted - promoting:.1f} s after the promotion was asked for; the new primary may answer "
              f"before `promote` returns), the publisher's "
              f"first event stored there acknowledged by the broker {first_published - killed_at:.1f} s (at most)")
