"""``commitline serve --operator-port``: the operators' views (the status page, ``/v1/status``, ``/metrics``),
which need no API key and show every tenant's stuck sagas, are served only on their own port; the API's port,
the one tenants reach, answers them 404. ``commitline serve`` as a real subprocess, over TCP with httpx, with one
worker and with two (the supervisor's operators' port then reports both workers' counts)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx

from tests.integration.http.conftest import cli_env, free_port, start_server
from tests.integration.http.test_operations import PAYMENT, commands, scrape
from tests.support import wait_for

OPERATOR_PATHS = ("/", "/v1/status", "/metrics", "/static/status.js")


def _payment(base_url: str, api_key: str) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/commands", json=PAYMENT, timeout=60,
                      headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": f"k-{uuid.uuid4()}"})


def _free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_the_operators_views_answer_only_on_their_own_port(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    operator_port = free_port()
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", "--operator-port", str(operator_port))
    operators = f"http://127.0.0.1:{operator_port}"
    try:
        for path in OPERATOR_PATHS:  # the tenants' port: as if they did not exist
            hidden = httpx.get(f"{server.base_url}{path}", timeout=30)
            assert hidden.status_code == 404 and hidden.json()["code"] == "not_found", (path, hidden.text)
        described = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()["paths"]
        assert "/v1/status" not in described and "/metrics" not in described and "/v1/commands" in described
        assert httpx.get(f"{server.base_url}/readyz", timeout=30).status_code == 200  # probes stay on both ports

        assert _payment(server.base_url, server.key("acme")).status_code == 201
        _, samples = scrape(operators)  # what the API's port did, counted in this process
        assert commands(samples, "create_payment", "applied") == 1
        status = httpx.get(f"{operators}/v1/status", timeout=30)
        assert status.status_code == 200 and status.json()["head"] == 1
        page = httpx.get(f"{operators}/", timeout=30)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert httpx.get(f"{operators}/healthz", timeout=30).status_code == 200
        not_the_api = _payment(operators, server.key("acme"))  # tenants' requests are not answered there
        assert not_the_api.status_code == 404, not_the_api.text
    finally:
        assert server.stop() == 0, server.output()
    assert _free(operator_port), "serve stopped its operators' port too"
    assert f"the operators' views at http://127.0.0.1:{operator_port}/" in server.output()


def test_with_two_workers_the_operators_port_reports_every_workers_counts(pg_dsn: str, schema: str,
                                                                          tmp_path: Path) -> None:
    operator_port = free_port()  # from the environment this time
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", "--workers", "2",
                          COMMITLINE_HTTP_OPERATOR_PORT=str(operator_port))
    operators = f"http://127.0.0.1:{operator_port}"
    try:
        api_key = server.key("acme")
        statuses = [_payment(server.base_url, api_key).status_code for _ in range(12)]  # a connection each
        assert statuses == [201] * 12
        for path in OPERATOR_PATHS:  # whichever worker answers
            assert httpx.get(f"{server.base_url}{path}", timeout=30).status_code == 404, path
        wait_for(lambda: commands(scrape(operators)[1], "create_payment", "applied") == 12,
                 "the operators' port to report the 12 commands of both workers", timeout=60)
        assert httpx.get(f"{operators}/v1/status", timeout=30).json()["head"] == 12
    finally:
        assert server.stop() == 0, server.output()
    assert _free(operator_port)


def test_an_operators_port_that_cannot_be_listened_on_is_refused_before_anything_starts(pg_dsn: str,
                                                                                       schema: str) -> None:
    env = cli_env(pg_dsn, schema)
    port = free_port()

    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "commitline.cli", "serve", "--port", str(port), *args],
                              env=env, capture_output=True, text=True, timeout=120)

    same = serve("--operator-port", str(port))
    assert same.returncode == 2 and "is the API's port" in same.stderr, same.stderr
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = serve("--operator-port", str(holder.getsockname()[1]))
    assert taken.returncode == 3 and "choose another --operator-port" in taken.stderr, taken.stderr
    wrong = serve("--operator-port", "0")
    assert wrong.returncode == 2 and "not a TCP port" in wrong.stderr
