"""The ``commitline`` console script, run as a real subprocess against the test database."""

from __future__ import annotations

import os
import subprocess
import sys
from uuid import uuid4

import orjson

from tests.support import count_rows


def commitline(args: list[str], pg_dsn: str, schema: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=120)


def test_help_lists_every_command(pg_dsn: str, schema: str) -> None:
    out = commitline(["--help"], pg_dsn, schema)
    assert out.returncode == 0
    for name in ("dispatch", "publish", "status", "demo"):
        assert name in out.stdout


def test_dispatch_prints_the_result_and_replays(pg_dsn: str, schema: str) -> None:
    command = '{"type": "create_payment", "amount": "10.00", "currency": "GBP", "account": "acc"}'
    first = commitline(["dispatch", "-k", "cli-1", command], pg_dsn, schema)
    assert first.returncode == 0, first.stderr
    result = orjson.loads(first.stdout)
    assert result["version"] == 1 and result["replayed"] is False
    assert result["events"][0]["payload"] == {"amount": "10.00", "currency": "GBP", "account": "acc"}
    again = orjson.loads(commitline(["dispatch", "-k", "cli-1", command], pg_dsn, schema).stdout)
    assert again["replayed"] is True and again["aggregate_id"] == result["aggregate_id"]


def test_refusal_is_typed_json_on_stderr_with_nonzero_exit(pg_dsn: str, schema: str) -> None:
    out = commitline(["dispatch", "-k", "k", '{"type": "create_payment", "amount": "-1", "currency": "EUR", '
                      '"account": "a"}'], pg_dsn, schema)
    assert out.returncode == 1 and out.stdout == ""
    error = orjson.loads(out.stderr.strip().splitlines()[-1])
    assert error["code"] == "invalid_command" and error["details"]["errors"][0]["loc"] == ["amount"]
    missing_key = commitline(["dispatch", '{"type": "submit_payment", "payment_id": "%s"}' % uuid4()], pg_dsn, schema)
    assert missing_key.returncode == 1
    missing = orjson.loads(missing_key.stderr.strip().splitlines()[-1])
    assert missing["code"] == "missing_idempotency_key" and "-k KEY (--idempotency-key)" in missing["message"]
    unknown = commitline(["dispatch", "-k", "k2", '{"type": "request_refund"}'], pg_dsn, schema)
    assert unknown.returncode == 1
    refusal = orjson.loads(unknown.stderr)  # one JSON document, its hint in it
    assert refusal["code"] == "unknown_command_type" and "the domain in use is the built-in examples" in \
        refusal["hint"] and "--app" in refusal["hint"]
    bad_key = commitline(["dispatch", "-k", " ", '{"type": "create_survey_task", "title": "t"}'], pg_dsn, schema)
    assert orjson.loads(bad_key.stderr)["code"] == "invalid_idempotency_key"  # not told it is missing
    assert count_rows(pg_dsn, schema)["events"] == 0


def test_json_lines_on_stdin(pg_dsn: str, schema: str) -> None:
    item = str(uuid4())
    lines = "\n".join([
        orjson.dumps({"type": "receive_stock", "item_id": item, "quantity": 3}).decode(),
        orjson.dumps({"command": {"type": "reserve_stock", "item_id": item, "reservation_id": "r1", "quantity": 2},
                      "idempotency_key": "explicit"}).decode(),
        orjson.dumps({"type": "reserve_stock", "item_id": item, "reservation_id": "r2", "quantity": 2}).decode(),
    ])
    out = commitline(["dispatch", "-k", "batch"], pg_dsn, schema, stdin=lines)
    assert out.returncode == 1  # the third line is refused: only 1 unit left
    results = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert [r["line"] for r in results] == [1, 2]
    assert [r["result"]["version"] for r in results] == [1, 2]
    assert [r["replayed"] for r in results] == [False, False]
    # a plain line's key comes from its content, under the -k namespace; an envelope keeps its own
    plain_key = results[0]["idempotency_key"]
    assert plain_key.startswith("batch:sha256:") and len(plain_key) == len("batch:sha256:") + 64
    assert results[1]["idempotency_key"] == "explicit"
    errors = [orjson.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    third_key = errors[0].get("idempotency_key", "")
    assert third_key.startswith("batch:sha256:") and third_key != plain_key
    assert errors == [{"line": 3, "idempotency_key": third_key, "error": "InsufficientStock",
                       "code": "insufficient_stock", "message": f"item {item}: requested 2, available 1",
                       "details": {"item_id": item, "requested": 2, "available": 1}}]


def test_bad_configuration_exits_3_without_echoing_secrets(pg_dsn: str, schema: str) -> None:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": "postgresql://u:s3cret@127.0.0.1:1/db",
           "COMMITLINE_SCHEMA": schema}
    out = subprocess.run([sys.executable, "-m", "commitline.cli", "dispatch", "-k", "k", "{}"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 3
    assert "s3cret" not in out.stderr and "store_unavailable" in out.stderr
    env["COMMITLINE_SNAPSHOT_INTERVAL"] = "-4"
    out = subprocess.run([sys.executable, "-m", "commitline.cli", "dispatch", "-k", "k", "{}"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 3 and "COMMITLINE_SNAPSHOT_INTERVAL" in out.stderr


def test_status_shows_followers_with_lag(pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    for n in range(3):
        commitline(["dispatch", "-k", f"s{n}", '{"type": "receive_stock", "item_id": "%s", "quantity": 1}' % uuid4()],
                   pg_dsn, schema)
    empty = orjson.loads(commitline(["status", "--json"], pg_dsn, schema).stdout)
    assert (empty["head"], empty["stuck_fulfilments"]) == (3, [])
    assert {f["status"] for f in empty["followers"]} == {"never run"}  # every known follower is listed
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "COMMITLINE_KAFKA_IDEMPOTENCE": "false",
           "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}."}
    drained = subprocess.run([sys.executable, "-m", "commitline.cli", "publish", "--drain"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert drained.returncode == 0, drained.stderr[-2000:]
    commitline(["dispatch", "-k", "s9", '{"type": "receive_stock", "item_id": "%s", "quantity": 1}' % uuid4()],
               pg_dsn, schema)
    status = orjson.loads(commitline(["status", "--json"], pg_dsn, schema).stdout)
    (publisher,) = [f for f in status["followers"] if f["status"] != "never run"]
    assert (publisher["name"], publisher["status"], publisher["position"]) == ("kafka-publisher", "stopped", 3)
    assert (status["head"], publisher["lag_events"]) == (4, 1) and publisher["lag_seconds"] >= 0
    table = commitline(["status"], pg_dsn, schema)
    assert table.returncode == 0 and "kafka-publisher" in table.stdout
