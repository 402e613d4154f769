"""The operations endpoints against ``commitline serve`` as a real subprocess, over TCP with httpx:
``/healthz``, ``/readyz`` (ready, then not once the schema is behind), ``/metrics`` counting commands by
type, outcome and code with the latency histogram, the counts of two workers adding up, and the
``--metrics-port`` of ``commitline project`` (a real subprocess) reporting follower positions.

Metrics are read with prometheus-client's own parser; counters are compared before and after each test's
requests, since the module's tests share one server.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from commitline.infrastructure.metrics import catalogue
from tests.integration.http.conftest import Server, cli_env, free_port, start_server
from tests.stalling_proxy import StallingProxy
from tests.support import count_rows, wait_for

PROBLEM_JSON = "application/problem+json"
PAYMENT = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-ops"}
PROJECTION_NAMES = ("inventory_levels", "order_fulfilments", "payment_states", "task_statuses")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def commands(samples: Samples, type_: str, outcome: str, code: str = "") -> float:
    return value(samples, "commitline_commands_total", type=type_, outcome=outcome, code=code)


def scrape(base_url: str) -> tuple[httpx.Response, Samples]:
    response = httpx.get(f"{base_url}/metrics", timeout=30)  # no API key: an operator endpoint
    assert response.status_code == 200, response.text
    return response, parse(response.text)


def key() -> str:
    return f"k-{uuid.uuid4()}"


def sql(dsn: str, query: str, *params: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchone()


def log_head(dsn: str, schema: str) -> int:
    return int(sql(dsn, f'SELECT coalesce(max(notification_id), 0) FROM "{schema}".events')[0])


def test_healthz_answers_without_a_key_or_the_database(served: Server) -> None:
    response = httpx.get(f"{served.base_url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "alive"}


def test_readyz_is_ready_then_not_once_the_schema_is_behind(served: Server, pg_dsn: str, module_schema: str) -> None:
    ready = httpx.get(f"{served.base_url}/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"status": "ready"}

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        version, description = conn.execute(
            f'DELETE FROM "{module_schema}".schema_migrations WHERE version = '
            f'(SELECT max(version) FROM "{module_schema}".schema_migrations) RETURNING version, description').fetchone()
    try:
        behind = httpx.get(f"{served.base_url}/readyz")
        assert behind.status_code == 503
        assert behind.headers["content-type"] == PROBLEM_JSON
        assert behind.headers["retry-after"]
        problem = behind.json()
        assert problem["code"] == "not_ready" and problem["status"] == 503
        assert problem["type"] == "urn:commitline:problem:not_ready"
        assert len(problem["reasons"]) == 1 and f"lacks migration {version}" in problem["reasons"][0]
        assert problem["details"]["reasons"] == problem["reasons"]
        assert httpx.get(f"{served.base_url}/healthz").status_code == 200  # alive all the same
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{module_schema}".schema_migrations (version, description) VALUES (%s, %s)',
                         (version, description))
    assert httpx.get(f"{served.base_url}/readyz").status_code == 200


def test_without_a_master_key_a_domain_with_personal_fields_is_not_ready_and_each_503_says_when_to_retry(
        pg_dsn: str, schema: str, tmp_path: Path) -> None:
    """With a configured database and no ``COMMITLINE_MASTER_KEY``, a payment (its account is personal) can be
    neither written nor read: the server answers 503 ``configuration_error`` naming the setting, with a
    ``Retry-After`` as every 503 has, and ``/readyz`` says it is not ready, so that a rolling deploy missing the
    key stops at its first process instead of replacing ready ones; the log says why as the server starts."""
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", COMMITLINE_MASTER_KEY="")
    try:
        with server.client("acme") as acme:
            refused = acme.post("/v1/commands", headers={"Idempotency-Key": "no-key-1"}, json={
                "type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "DE89370400440532013000"})
            assert refused.status_code == 503 and refused.json()["code"] == "configuration_error", refused.text
            assert "COMMITLINE_MASTER_KEY" in refused.json()["detail"] and refused.headers["retry-after"] == "30"
        ready = httpx.get(f"{server.base_url}/readyz")
        assert ready.status_code == 503 and ready.headers["retry-after"], ready.text
        (reason,) = ready.json()["reasons"]
        assert reason.startswith("personal fields cannot be written or read: COMMITLINE_MASTER_KEY"), reason
        assert count_rows(pg_dsn, schema)["events"] == 0
        # the reason is in the log too, once (logged as the server started, not again for each probe)
        assert server.output().count(f"not ready: {reason}") == 1, server.output()
    finally:
        server.stop()


def test_metrics_count_commands_by_type_outcome_and_code(served: Server, acme: httpx.Client, pg_dsn: str,
                                                         module_schema: str) -> None:
    _, before = scrape(served.base_url)
    created_key = key()
    created = acme.post("/v1/commands", json=PAYMENT, headers={"Idempotency-Key": created_key})
    assert created.status_code == 201, created.text
    payment_id = created.json()["aggregate_id"]
    replayed = acme.post("/v1/commands", json=PAYMENT, headers={"Idempotency-Key": created_key})
    assert replayed.status_code == 201 and replayed.headers["idempotent-replayed"] == "true"
    submit = {"type": "submit_payment", "payment_id": payment_id, "expected_version": 1}
    assert acme.post("/v1/commands", json=submit, headers={"Idempotency-Key": key()}).status_code == 200
    stale = {"type": "complete_payment", "payment_id": payment_id, "expected_version": 1}
    conflict = acme.post("/v1/commands", json=stale, headers={"Idempotency-Key": key()})
    assert conflict.status_code == 409 and conflict.json()["code"] == "concurrency_conflict"
    again = {"type": "submit_payment", "payment_id": payment_id}
    illegal = acme.post("/v1/commands", json=again, headers={"Idempotency-Key": key()})
    assert illegal.status_code == 409 and illegal.json()["code"] == "illegal_transition"
    unknown = acme.post("/v1/commands", json={"type": "drop_tables"}, headers={"Idempotency-Key": key()})
    assert unknown.status_code == 422 and unknown.json()["code"] == "unknown_command_type"
    malformed = acme.post("/v1/commands", content=b'{"type":', headers={"Idempotency-Key": key(),
                                                                         "Content-Type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["code"] == "malformed_json"

    response, after = scrape(served.base_url)
    assert response.headers["content-type"].startswith("text/plain")

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    def commands_delta(type_: str, outcome: str, code: str = "") -> float:
        return commands(after, type_, outcome, code) - commands(before, type_, outcome, code)

    assert commands_delta("create_payment", "applied") == 1
    assert commands_delta("create_payment", "replayed") == 1
    assert commands_delta("submit_payment", "applied") == 1
    assert commands_delta("complete_payment", "refused", "concurrency_conflict") == 1
    assert commands_delta("submit_payment", "refused", "illegal_transition") == 1
    assert commands_delta("unknown", "refused", "unknown_command_type") == 1  # never the caller's text
    assert commands_delta("unknown", "refused", "malformed_json") == 1  # the code the caller was answered
    assert commands_delta("unknown", "refused", "invalid_command") == 0
    assert "drop_tables" not in response.text
    assert delta("commitline_conflicts_total", type="complete_payment") == 1
    assert delta("commitline_conflicts_total", type="submit_payment") == 0

    # the latency histogram: one observation per dispatch, in cumulative buckets
    assert delta("commitline_dispatch_seconds_count", type="create_payment") == 2
    assert delta("commitline_dispatch_seconds_count", type="submit_payment") == 2
    assert delta("commitline_dispatch_seconds_bucket", type="create_payment", le="+Inf") == 2
    assert delta("commitline_dispatch_seconds_sum", type="create_payment") > 0
    buckets = sorted((float(dict(labels)["le"]), v) for (name, labels), v in after.items()
                     if name == "commitline_dispatch_seconds_bucket" and dict(labels)["type"] == "create_payment")
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)

    # HTTP requests by route template and status
    route = {"method": "POST", "route": "/v1/commands"}
    assert delta("commitline_http_requests_total", **route, status="201") == 2
    assert delta("commitline_http_requests_total", **route, status="200") == 1
    assert delta("commitline_http_requests_total", **route, status="409") == 2
    assert delta("commitline_http_requests_total", **route, status="422") == 1
    assert delta("commitline_http_requests_total", **route, status="400") == 1
    assert delta("commitline_http_request_seconds_count", **route) == 7

    # read from PostgreSQL at scrape time: the log head and every known follower (none runs here)
    head, events = log_head(pg_dsn, module_schema), count_rows(pg_dsn, module_schema)["events"]
    assert value(after, "commitline_store_up") == 1
    assert value(after, "commitline_log_head") == head
    for name in ("kafka-publisher", "order-fulfilment", *PROJECTION_NAMES):
        assert value(after, "commitline_follower_position", follower=name) == 0
        assert value(after, "commitline_follower_lag_events", follower=name) == events
        assert value(after, "commitline_follower_alive", follower=name) == 0
        assert value(after, "commitline_follower_status", follower=name, status="never run") == 1
    assert value(after, "commitline_fulfilments_stuck") == 0
    assert served.key("acme") not in response.text



def test_each_request_is_counted_under_its_own_method_and_route(served: Server) -> None:
    """A HEAD is counted as a HEAD (the server answers it as a GET), and the framework's own ``/openapi.json``
    under its route, not as unmatched (which only a request no route answers is)."""
    _, before = scrape(served.base_url)
    assert httpx.head(f"{served.base_url}/healthz").status_code == 200
    assert httpx.get(f"{served.base_url}/openapi.json").status_code == 200
    assert httpx.get(f"{served.base_url}/no-such-route").status_code == 404
    _, after = scrape(served.base_url)

    def delta(**labels: str) -> float:
        return value(after, "commitline_http_requests_total", **labels) - value(
            before, "commitline_http_requests_total", **labels)

    assert delta(method="HEAD", route="/healthz", status="200") == 1
    assert delta(method="GET", route="/healthz", status="200") == 0
    assert delta(method="GET", route="/openapi.json", status="200") == 1
    assert delta(method="GET", route="unmatched", status="404") == 1

def test_every_exported_metric_is_in_the_documented_catalogue(served: Server, acme: httpx.Client) -> None:
    """The reference's metrics page is rendered from ``catalogue()``: a metric a scrape shows must be there, with
    its type and labels."""
    assert acme.post("/v1/commands", json=PAYMENT, headers={"Idempotency-Key": key()}).status_code == 201
    response, _ = scrape(served.base_url)
    documented = {name: (kind, set(labels)) for name, kind, labels, _ in catalogue()}
    exported = {f.name: f for f in text_string_to_metric_families(response.text) if f.name.startswith("commitline_")}
    assert {"commitline_commands", "commitline_log_head", "commitline_follower_position"} <= set(exported)
    assert not [line for line in response.text.splitlines() if "_created" in line.split("{")[0]], \
        "no *_created series: the reference does not list them, and several workers would not show them"
    for name, family in exported.items():
        assert name in documented, f"{name} is exported but not in the metrics reference"
        kind, labels = documented[name]
        assert family.type == kind, (name, family.type, kind)
        seen = {label for s in family.samples for label in s.labels} - {"le"}
        assert seen <= labels, (name, seen, labels)


def test_metrics_count_retries_of_commands_whose_stream_moved(served: Server, acme: httpx.Client, pg_dsn: str,
                                                              module_schema: str) -> None:
    """Concurrent receive_stock on one item (no expected_version) re-run after losing the append: each
    re-run is counted, and every command still applies once."""
    _, before = scrape(served.base_url)
    item, sent = str(uuid.uuid4()), 0
    command = {"type": "receive_stock", "item_id": item, "quantity": 1}

    def send(_: int) -> int:
        return acme.post("/v1/commands", json=command, headers={"Idempotency-Key": key()}).status_code

    def retried() -> bool:
        nonlocal sent
        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(send, range(16)))
        sent += len(statuses)
        assert set(statuses) <= {200, 201}, statuses
        _, now = scrape(served.base_url)
        return value(now, "commitline_dispatch_retries_total", type="receive_stock") > value(
            before, "commitline_dispatch_retries_total", type="receive_stock")

    wait_for(retried, "a receive_stock re-run after its stream moved", timeout=120)
    _, after = scrape(served.base_url)
    assert commands(after, "receive_stock", "applied") - commands(before, "receive_stock", "applied") == sent
    stored = sql(pg_dsn, f'SELECT count(*), max(originator_version) FROM "{module_schema}".events '
                 "WHERE originator_id = %s", item)
    assert tuple(stored) == (sent, sent)


def _worker_counts(directory: Path) -> dict[str, float]:
    """Each worker's own count of applied create_payment commands, from its multiprocess file."""
    counts = {}
    for path in directory.glob("counter_*.db"):
        merged = MultiProcessCollector.merge([str(path)])
        counts[path.name] = sum(s.value for m in merged for s in m.samples
                                if s.name == "commitline_commands_total"
                                and s.labels == {"type": "create_payment", "outcome": "applied", "code": ""})
    return counts


def _metrics_dir(process: subprocess.Popen[bytes]) -> Path:
    """The PROMETHEUS_MULTIPROC_DIR ``serve`` gave its workers (read from a worker's environment)."""
    for child in psutil.Process(process.pid).children(recursive=True):
        try:
            found = child.environ().get("PROMETHEUS_MULTIPROC_DIR")
        except psutil.Error:
            continue
        if found:
            return Path(found)
    raise AssertionError("no worker process has PROMETHEUS_MULTIPROC_DIR")


def test_metrics_add_up_across_two_workers(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", "--workers", "2")
    try:
        directory = _metrics_dir(server.process)
        assert directory.is_dir()
        headers = {"Authorization": f"Bearer {server.key('acme')}"}
        sent = 0

        def send(_: int) -> int:  # a new connection each: the kernel hands connections to either worker
            return httpx.post(f"{server.base_url}/v1/commands", json=PAYMENT, timeout=60,
                              headers={**headers, "Idempotency-Key": key()}).status_code

        def both_served() -> bool:
            nonlocal sent
            with ThreadPoolExecutor(8) as pool:
                statuses = list(pool.map(send, range(24)))
            sent += len(statuses)
            assert statuses == [201] * len(statuses)
            return len([c for c in _worker_counts(directory).values() if c > 0]) >= 2

        wait_for(both_served, "both workers to serve some of the commands", timeout=180)
        per_worker = _worker_counts(directory)
        assert sum(per_worker.values()) == sent

        for _ in range(4):  # whichever worker answers the scrape, it reports every worker's counts
            _, samples = scrape(server.base_url)
            assert commands(samples, "create_payment", "applied") == sent
            assert value(samples, "commitline_http_requests_total", method="POST", route="/v1/commands",
                         status="201") == sent
            assert value(samples, "commitline_dispatch_seconds_count", type="create_payment") == sent
            assert value(samples, "commitline_log_head") == log_head(pg_dsn, schema)
    finally:
        assert server.stop() == 0, server.output()
    assert not directory.exists(), "serve removes its metrics directory on exit"


def test_workers_stop_when_serve_is_killed_and_the_port_is_free_again(pg_dsn: str, schema: str,
                                                                       tmp_path: Path) -> None:
    """kill -9 of serve's supervisor leaves no worker serving on its port: each is told to stop by the kernel."""
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", "--workers", "2")
    supervisor = psutil.Process(server.process.pid)

    def started() -> list[psutil.Process] | None:
        kids = [c for c in supervisor.children() if "resource_tracker" not in " ".join(c.cmdline())]
        return kids if len(kids) >= 2 else None

    workers = wait_for(started, "serve's two workers to start", timeout=120)
    server.process.kill()  # SIGKILL: the supervisor cleans up nothing
    server.process.wait(timeout=30)
    try:
        wait_for(lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers),
                 "the orphaned workers to stop", timeout=60)
    finally:  # failing, leave no worker behind for the tests after this one
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.kill()
    with socket.socket() as probe:  # nothing listens on serve's port any more: a new serve can take it
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])))


def test_serve_on_a_port_in_use_says_which_and_starts_nothing(pg_dsn: str, schema: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "commitline.cli", "serve", "--port", str(port), "--workers", "2"],
                              env=cli_env(pg_dsn, schema), capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert f"commitline serve: cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_project_metrics_port_reports_positions_reaching_the_log_head(served: Server, acme: httpx.Client,
                                                                      tmp_path: Path) -> None:
    for _ in range(3):
        assert acme.post("/v1/commands", json=PAYMENT, headers={"Idempotency-Key": key()}).status_code == 201
    port = free_port()
    log = (tmp_path / "project.log").open("wb")
    project = subprocess.Popen([sys.executable, "-m", "commitline.cli", "project", "--metrics-port", str(port)],
                               env=served.env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"

    def caught_up() -> Samples | None:
        assert project.poll() is None, (tmp_path / "project.log").read_text()
        try:
            response = httpx.get(url, timeout=10)
        except httpx.TransportError:
            return None
        samples = parse(response.text)
        head = value(samples, "commitline_log_head")
        if head and all(value(samples, "commitline_follower_position", follower=n) == head for n in PROJECTION_NAMES):
            return samples
        return None

    try:
        samples = wait_for(caught_up, "every projection's position to reach the log head", timeout=120)
        head = value(samples, "commitline_log_head")
        assert head >= 3
        for name in PROJECTION_NAMES:
            assert value(samples, "commitline_follower_lag_events", follower=name) == 0
            assert value(samples, "commitline_follower_alive", follower=name) == 1
            assert value(samples, "commitline_follower_status", follower=name, status="running") == 1
            assert value(samples, "commitline_follower_batches_total", follower=name) >= 1
        assert value(samples, "commitline_follower_events_handled_total", follower="payment_states") >= 3
        assert value(samples, "commitline_follower_position", follower="kafka-publisher") == 0  # not run
        mistyped = httpx.get(f"http://127.0.0.1:{port}/metric", timeout=10)  # never a healthy-looking target
        assert mistyped.status_code == 404 and "/metrics and /healthz" in mistyped.text
    finally:
        project.send_signal(signal.SIGINT)
        try:
            assert project.wait(timeout=60) == 0, (tmp_path / "project.log").read_text()
        finally:
            if project.poll() is None:
                project.kill()
                project.wait()
            log.close()


def answers(url: str) -> int | None:
    """The status ``url`` answers with, None if it does not answer in time (a loaded machine)."""
    try:
        return httpx.get(url, timeout=10).status_code
    except httpx.TransportError:
        return None


def test_a_worker_that_cannot_start_during_an_outage_is_started_again_and_the_others_serve_on(
        tmp_path: Path) -> None:
    """serve --workers 2 on its own PostgreSQL, which stops; a worker is lost meanwhile. Its replacement cannot use
    the store as it starts: uvicorn takes a failed start for a broken app and would stop serve and the other worker
    with it (exiting 0). Instead the replacement ends, serve starts another until the store is back, and every
    worker is ready again once PostgreSQL is."""
    from commitline.infrastructure.embedded.postgres import EmbeddedPostgres

    pg = EmbeddedPostgres(tmp_path / "pg")  # its own server: the session-wide one must never stop
    pg.start()
    server = None
    try:
        server = start_server(pg.dsn, "outage", tmp_path / "serve.log", "--workers", "2")
        supervisor = psutil.Process(server.process.pid)

        def workers() -> set[int]:
            found = set()
            for child in supervisor.children():
                with contextlib.suppress(psutil.Error):
                    if "resource_tracker" not in " ".join(child.cmdline()):
                        found.add(child.pid)
            return found

        started = wait_for(lambda: w if len(w := workers()) == 2 else None, "two workers", timeout=120)
        wait_for(lambda: answers(f"{server.base_url}/readyz") == 200, "serve to be ready", timeout=60)
        pg.stop()
        psutil.Process(min(started)).kill()
        replacements: set[int] = set()

        def replaced_twice() -> bool:  # a replacement met the outage, ended, and serve started another
            assert server.process.poll() is None, server.output()[-3000:]
            replacements.update(workers() - started)
            return len(replacements) >= 2

        wait_for(replaced_twice, "serve to start a worker again after one met the outage", timeout=90)
        assert server.process.poll() is None, "serve runs on"
        assert "cannot use PostgreSQL as it starts" in server.output()
        pg.start()
        wait_for(lambda: all(answers(f"{server.base_url}/readyz") == 200 for _ in range(6)),
                 "every worker to be ready again", timeout=120)
    finally:
        if server is not None:
            assert server.stop() == 0, server.output()[-3000:]
        pg.stop()


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ ")


def test_every_line_serve_and_its_workers_log_has_one_layout_and_the_chosen_level(pg_dsn: str, schema: str,
                                                                                  tmp_path: Path) -> None:
    """uvicorn's own lines, its access lines and commitline's, in serve and in each worker it spawns: time, level,
    logger, message, one line each; and COMMITLINE_LOG_LEVEL holds for all of them."""
    for level, log in (("INFO", "info.log"), ("WARNING", "warning.log")):
        server = start_server(pg_dsn, schema, tmp_path / log, "--workers", "2", COMMITLINE_LOG_LEVEL=level)
        try:
            assert answers(f"{server.base_url}/v1/aggregates/{uuid.uuid4()}") == 401
        finally:
            assert server.stop() == 0, server.output()[-3000:]
        lines = [line for line in server.output().splitlines() if line.strip()]
        assert not [line for line in lines if not LOG_LINE.match(line)], lines[:20]
        if level == "INFO":
            assert sum("Started server process" in line for line in lines) >= 2  # both workers, in the layout
            assert any('"GET /v1/aggregates/' in line and " uvicorn.access " in line for line in lines), lines
        else:
            assert not [line for line in lines if " INFO " in line or " DEBUG " in line], lines[:20]


def test_readyz_answers_503_at_once_while_the_database_takes_connections_but_does_not_answer(
        pg_dsn: str, schema: str, tmp_path: Path) -> None:
    """A stalled database (a frozen primary, a hung pooler: connections open, no answer) makes ``/readyz`` answer
    503 within a few seconds, not hold the probe for as long as the stall lasts; once it answers again, so
    does the probe, ready."""
    proxy = StallingProxy(pg_dsn)
    server = start_server(proxy.dsn, schema, tmp_path / "serve.log")
    try:
        wait_for(lambda: httpx.get(f"{server.base_url}/readyz").status_code == 200, "the server to be ready")
        proxy.stall()
        for _ in range(2):  # the second probe while the first one's query is still unanswered
            answered = httpx.get(f"{server.base_url}/readyz", timeout=30)
            assert answered.status_code == 503 and answered.headers["retry-after"], answered.text
            assert answered.elapsed.total_seconds() < 10, answered.elapsed
            assert answered.json()["reasons"][0].startswith("database unreachable"), answered.text
        assert "did not answer within 2 s" in server.output()
        proxy.resume()
        wait_for(lambda: httpx.get(f"{server.base_url}/readyz", timeout=30).status_code == 200,
                 "the probe to answer ready once the database answers again")
    finally:
        server.stop()
        proxy.close()

