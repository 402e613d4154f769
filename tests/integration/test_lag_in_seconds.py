"""Lag as time: every follower's lag, and each publisher bucket's, is the age of its oldest unhandled event
besides the count, in ``commitline status --json``, ``projections list --json``, the status document of
``/v1/status`` and the status page a real Chromium renders from it, and the Prometheus metrics; against a
real PostgreSQL and broker."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any
from uuid import uuid4

from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from commitline.composition import bootstrap
from commitline.http.status_page import status_document
from commitline.infrastructure.kafka.publisher import PUBLISHER
from commitline.infrastructure.metrics import render
from commitline.infrastructure.store.log import bucket_of
from tests.integration.http.conftest import start_server
from tests.integration.http.test_status_page import Rendered, chromium
from tests.support import FollowerThread, kafka_settings, wait_for

BUCKETS = 4
LAGGING_FOR = 1.5  # seconds the new events wait before the figures are read


def cli_json(pg_dsn: str, schema: str, *argv: str) -> Any:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "COMMITLINE_PUBLISH_BUCKETS": str(BUCKETS)}
    out = subprocess.run([sys.executable, "-m", "commitline.cli", *argv, "--json"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return orjson.loads(out.stdout)


def gauge(text: str, name: str, **labels: str) -> float:
    return next(s.value for family in text_string_to_metric_families(text) for s in family.samples
                if s.name == name and s.labels == labels)


def test_every_follower_and_publisher_bucket_shows_its_lag_in_seconds(pg_dsn: str, schema: str,
                                                                      kafka_bootstrap: str, tmp_path: Path) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=BUCKETS)
    with bootstrap(settings) as app:
        app.dispatch({"type": "create_survey_task", "title": "early"}, idempotency_key=f"early-{uuid4()}")
        head = app.recorder.max_notification_id()
        with FollowerThread(app.publisher) as publisher, \
                FollowerThread(lambda: app.projector("task_statuses", poll_interval=0.1)) as projector:
            publisher.wait_until_at(head)
            projector.wait_until_at(head)
        late = app.dispatch({"type": "create_survey_task", "title": "late"},
                            idempotency_key=f"late-{uuid4()}").aggregate_id
        lagging_bucket = bucket_of(late, BUCKETS)

        def old_enough() -> Any:
            report = cli_json(pg_dsn, schema, "status")
            task = next(f for f in report["followers"] if f["name"] == "task_statuses")
            return report if task["lag_seconds"] >= LAGGING_FOR else None

        report = wait_for(old_enough, f"the unhandled event to be {LAGGING_FOR} s old")
        followers = {f["name"]: f for f in report["followers"]}
        assert all(isinstance(f["lag_seconds"], float) for f in followers.values())
        assert followers["task_statuses"]["lag_events"] == 1
        assert followers["payment_states"]["lag_events"] == 2 and followers["payment_states"]["lag_seconds"] >= \
            followers["task_statuses"]["lag_seconds"], "never run: its oldest unhandled event is the first one"
        buckets = {b["bucket"]: b for b in report["publisher"]["buckets"]}
        assert (buckets[lagging_bucket]["lag_events"], buckets[lagging_bucket]["lag_seconds"] >= LAGGING_FOR) == (
            1, True)
        assert all((b["lag_events"], b["lag_seconds"]) == (0, 0.0) for n, b in buckets.items() if n != lagging_bucket)

        (listed,) = [p for p in cli_json(pg_dsn, schema, "projections", "list")["projections"]
                     if p["name"] == "task_statuses"]
        assert listed["lag_events"] == 1 and listed["lag_seconds"] >= LAGGING_FOR

        page = status_document(app)  # what /v1/status returns and the status page renders
        assert next(f for f in page["followers"] if f["name"] == "task_statuses")["lag_seconds"] >= LAGGING_FOR
        assert page["publisher"]["buckets"][lagging_bucket]["lag_seconds"] >= LAGGING_FOR

        metrics = render(app.status).decode()
        assert gauge(metrics, "commitline_follower_lag_seconds", follower="task_statuses") >= LAGGING_FOR
        assert gauge(metrics, "commitline_follower_lag_seconds", follower=PUBLISHER) >= LAGGING_FOR
        assert gauge(metrics, "commitline_publisher_bucket_lag_seconds", bucket=str(lagging_bucket)) >= LAGGING_FOR
        assert gauge(metrics, "commitline_publisher_bucket_lag_events", bucket=str(lagging_bucket)) == 1
        assert gauge(metrics, "commitline_publisher_bucket_lag_seconds", bucket=str((lagging_bucket + 1) % BUCKETS)) \
            == 0

        server = start_server(pg_dsn, schema, tmp_path / "serve.log", COMMITLINE_PUBLISH_BUCKETS=str(BUCKETS))
        try:
            served = httpx.get(f"{server.base_url}/v1/status", timeout=60).json()
            assert served["publisher"]["buckets"][lagging_bucket]["lag_events"] == 1
            dom = Rendered(chromium(tmp_path, "--dump-dom", f"{server.base_url}/").stdout.decode())
        finally:
            server.stop()
        assert "hidden" not in dom.attrs["publisher-section"]
        row = f"bucket-{lagging_bucket}"
        assert dom.text(row, "lag-events") == "1"
        shown = dom.text(row, "lag-seconds")
        assert shown.endswith((" s", " min")) and float(shown.split()[0]) > 0, shown
        assert dom.text(f"bucket-{(lagging_bucket + 1) % BUCKETS}", "lag-seconds") == "0.0 s"
        assert dom.text("follower-task_statuses", "lag-seconds").endswith((" s", " min"))
