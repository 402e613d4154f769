"""Where a personal value can be read in plain text, proven with real processes: ``commitline serve`` over TCP
(access log and tracing on, spans sent to a real OTLP receiver), ``commitline project`` and ``commitline sagas
run`` beside it, and the CLI. The domain (tests/domains/careless.py) quotes the value in every error it raises.

Every value sent holds one distinctive canary. It is written in none of: the processes' logs, the spans, the
``/metrics`` and ``/v1/status`` answers, any problem document, ``commitline status --json`` and ``projections
list --json``, and any table of the store's schema (events and parked reasons, idempotency records,
``follower_positions``, ``follower_interventions``, data keys, read models). It is in ``commitline audit
history --json``, on purpose, until the subject is erased."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from psycopg import sql

from tests.integration.http.conftest import Server, start_server
from tests.otlp_receiver import OtlpReceiver
from tests.support import wait_for

pytestmark = pytest.mark.integration
APP = "tests.domains.careless:domain"
WITHHELD = "<personal email>"


def commitline(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], capture_output=True, text=True,
                          timeout=180, env=env)


def follower(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "commitline.cli", *args], env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def every_row(dsn: str, schema: str) -> dict[str, str]:
    """Each table of the schema, all its rows as text (bytea columns in hex and as UTF-8 text)."""
    out = {}
    with psycopg.connect(dsn) as conn:
        tables = [t for (t,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'",
            (schema,))]
        for table in tables:
            rows = conn.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
            out[table] = "\n".join(" ".join(bytes(v).decode("utf-8", "replace") if isinstance(v, (bytes, memoryview))
                                            else str(v) for v in row) for row in rows)
    return out


def follower_row(dsn: str, schema: str, name: str) -> tuple[str, Any]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql.SQL("SELECT status, error FROM {}.follower_positions WHERE name = %s").format(
            sql.Identifier(schema)), (name,)).fetchone()
    return row or ("", None)


def parked_reasons(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT state FROM {}.events WHERE topic LIKE %s").format(sql.Identifier(schema)),
                            ("%GreetingParked%",)).fetchall()
    return [orjson.loads(bytes(state))["data"]["reason"] for (state,) in rows]


def test_a_personal_value_is_in_no_log_trace_metric_answer_or_record_of_commitline(pg_dsn: str, schema: str,
                                                                                   tmp_path: Path) -> None:
    canary = f"PLAINTEXT-CANARY-{uuid.uuid4().hex}"
    with OtlpReceiver() as otlp:
        env = {"COMMITLINE_APP": APP, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        server: Server = start_server(pg_dsn, schema, tmp_path / "serve.log", **env)
        project = follower(server.env, tmp_path / "project.log", "project")
        sagas = follower(server.env, tmp_path / "sagas.log", "sagas", "run")
        try:
            acme = server.client("acme")

            def add(contact: str, email: str, key: str) -> httpx.Response:
                return acme.post("/v1/commands", json={"type": "add_contact", "contact_id": contact, "email": email},
                                 headers={"Idempotency-Key": key})

            created = add("c-ok", f"{canary}-ok@example.test", "add-ok")
            assert created.status_code == 201, created.text
            refused = {
                "blocked by the domain": add("c-blocked", f"blocked-{canary}@example.test", "add-blocked"),
                "too long": add("c-long", canary + "x" * 200, "add-long"),
                "holding NUL": add("c-nul", canary + "\x00", "add-nul"),
                "key reused": add("c-ok", f"other-{canary}@example.test", "add-ok"),
            }
            assert {why: (r.status_code, r.json()["code"]) for why, r in refused.items()} == {
                "blocked by the domain": (422, "invalid_value"), "too long": (422, "invalid_command"),
                "holding NUL": (422, "invalid_command"), "key reused": (422, "idempotency_key_reused")}
            blocked = refused["blocked by the domain"].json()
            assert blocked["details"] == {"field": "email", "value": None, "reason": "is on the blocked list"}
            assert blocked["detail"] == "email: is on the blocked list (a personal value: not shown)"
            assert refused["too long"].json()["errors"][0]["loc"] == ["email"]

            poisoned = add("c-poison", f"poison-{canary}@example.test", "add-poison")
            parked = add("c-saga", f"saga-fails-{canary}@example.test", "add-saga")
            assert poisoned.status_code == parked.status_code == 201

            status, error = wait_for(lambda: (row := follower_row(pg_dsn, schema, "contact_mailboxes"))[0] == "failed"
                                     and row, "contact_mailboxes to stop at the poison event", timeout=120)
            assert error["message"] == f"ValueError: no mailbox for {WITHHELD}", error
            (reason,) = wait_for(lambda: parked_reasons(pg_dsn, schema), "greeter to park c-saga", timeout=120)
            assert reason == f"RuntimeError: cannot greet {WITHHELD}"

            scraped = {"/metrics": httpx.get(f"{server.base_url}/metrics", timeout=30),
                       "/v1/status": httpx.get(f"{server.base_url}/v1/status", timeout=30)}
            assert all(r.status_code == 200 for r in scraped.values()), scraped
            assert "commitline" in scraped["/metrics"].text and "contact_mailboxes" in scraped["/v1/status"].text
            said = {"status --json": commitline(server.env, "status", "--json"),
                    "projections list --json": commitline(server.env, "projections", "list", "--json"),
                    "projections skip": commitline(server.env, "projections", "skip", "contact_mailboxes",
                                                   "--position", str(error["position"]), "--reason", "ticket 7")}
            assert said["projections skip"].returncode == 0, said["projections skip"].stderr
            assert WITHHELD in said["status --json"].stdout
        finally:
            stop(project)
            stop(sagas)
            assert server.stop() == 0, server.output()

        wait_for(lambda: any(s.name == "dispatch add_contact"
                            and s.attributes.get("commitline.outcome") == "refused" for s in otlp.received()),
                 "the spans of the refused commands", timeout=60)
        spans = b"".join(otlp.bodies)

    logs = {name: (tmp_path / name).read_text(errors="replace") for name in ("serve.log", "project.log", "sagas.log")}
    assert '"POST /v1/commands HTTP/1.1" 422' in logs["serve.log"], "the access log is on"
    assert f"no mailbox for {WITHHELD}" in logs["project.log"], "the poison event is logged, its value withheld"
    assert f"cannot greet {WITHHELD}" in logs["sagas.log"], "the failures and the parking are logged"
    places: dict[str, str] = {
        **{f"log {name}": text for name, text in logs.items()},
        "OTLP export requests": spans.decode("utf-8", "replace"),
        **{f"problem document ({why})": r.text for why, r in refused.items()},
        **{f"GET {path}": r.text for path, r in scraped.items()},
        **{f"commitline {what}": done.stdout + done.stderr for what, done in said.items()},
        **{f"table {table}": rows for table, rows in every_row(pg_dsn, schema).items()},
    }
    assert "follower_interventions" in str(places.keys()) and "events" in str(places.keys())
    assert [place for place, text in places.items() if canary in text] == []

    # On purpose: an operator's audit history shows the subject's values, until the subject is erased.
    history = ["audit", "history", created.json()["aggregate_id"], "--tenant", "acme", "--json"]
    before = commitline(server.env, *history)
    assert before.returncode == 0 and f"{canary}-ok@example.test" in before.stdout, before.stderr
    erased = commitline(server.env, "erase", "--tenant", "acme", "--subject", "c-ok")
    assert erased.returncode == 0, erased.stderr
    after = commitline(server.env, *history)
    assert after.returncode == 0 and canary not in after.stdout and '"erased":true' in after.stdout.replace(" ", "")
