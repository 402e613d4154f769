"""``commitline init PATH``: a new service package that installs, passes its own specifications with
``pytest`` in its folder, and whose domain ``commitline --app <package>:domain serve`` answers over HTTP.
Every step is a real process, as a team runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.integration.http.conftest import free_port
from tests.support import wait_for


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_a_new_service_installs_passes_its_specs_and_serves_its_commands(tmp_path: Path, pg_dsn: str,
                                                                          schema: str) -> None:
    folder = tmp_path / "shelfwise"
    made = run([sys.executable, "-m", "commitline.cli", "init", str(folder)], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} == {
        "pyproject.toml", "README.md", "shelfwise/__init__.py", "shelfwise/refunds.py", "shelfwise/read_models.py",
        "tests/test_refunds.py"}
    assert "commitline --app shelfwise:domain serve" in (folder / "README.md").read_text()

    again = run([sys.executable, "-m", "commitline.cli", "init", str(folder)], cwd=tmp_path)
    assert again.returncode == 2 and "not an empty folder" in again.stderr, "an existing service is never overwritten"

    site = tmp_path / "site"
    installed = run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), "."],
                    cwd=folder)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert (site / "shelfwise" / "refunds.py").exists()
    tested = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=folder,
                 env={"PYTHONPATH": str(site)})
    assert tested.returncode == 0 and "4 passed" in tested.stdout, tested.stdout[-3000:] + tested.stderr[-3000:]

    env = {"PYTHONPATH": str(site), "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    key = run([sys.executable, "-m", "commitline.cli", "--app", "shelfwise:domain", "tenants", "add", "acme"],
              cwd=folder, env=env)
    assert key.returncode == 0, key.stderr
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "commitline.cli", "--app", "shelfwise:domain", "serve",
                               "--port", str(port), "--no-access-log"], cwd=folder, env={**os.environ, **env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        def answers() -> bool:
            assert server.poll() is None, server.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            try:
                return httpx.get(f"{base}/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(answers, "the service to answer", timeout=120)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key.stdout.strip()}"}) as http:
            schemas = http.get("/openapi.json").json()["components"]["schemas"]
            assert {"RequestRefund", "DecideRefund"} <= set(schemas) and "CreatePayment" not in schemas
            requested = http.post("/v1/commands", headers={"Idempotency-Key": "r-1"},
                                  json={"type": "request_refund", "amount": "25.00", "reason": "damaged"})
            assert requested.status_code == 201, requested.text
            refund = requested.json()["aggregate_id"]
            decided = http.post("/v1/commands", headers={"Idempotency-Key": "r-2"},
                                json={"type": "decide_refund", "refund_id": refund, "approve": True,
                                      "expected_version": 1})
            assert decided.status_code == 200 and decided.json()["events"][0]["type"] == "RefundDecided"
            late = http.post("/v1/commands", headers={"Idempotency-Key": "r-2-late"},
                             json={"type": "decide_refund", "refund_id": refund, "approve": True, "expected_version": 1})
            assert late.status_code == 409 and late.json()["code"] == "concurrency_conflict", late.text
            again = http.post("/v1/commands", headers={"Idempotency-Key": "r-3"},
                              json={"type": "decide_refund", "refund_id": refund, "approve": False})
            assert again.status_code == 409 and again.json()["code"] == "illegal_transition"
            state = http.get(f"/v1/aggregates/{refund}").json()
            assert (state["aggregate_type"], state["state"]["state"]) == ("Refund", "APPROVED")
    finally:
        server.terminate()
        server.wait(60)
