"""The safety benchmark over HTTP: 50 concurrent requests move the same submitted payment at the same
expected version, each under its own Idempotency-Key; exactly one is applied (200) and 49 are refused with
409 ``concurrency_conflict`` naming the actual version, nothing else; five payments in a row, with one
``commitline serve`` worker and with two (the requests then race across processes)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.integration.http.conftest import Server, start_server
from tests.support import count_rows

REQUESTS = 50
ROUNDS = 5
JSON = {"Content-Type": "application/json"}
CONFLICT = "concurrency_conflict"


def post(client: httpx.Client, command: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/commands", content=orjson.dumps(command),
                       headers={**JSON, "Idempotency-Key": f"k-{uuid.uuid4()}"})


def race(server: Server, pg_dsn: str, schema: str) -> None:
    with server.client("acme", limits=httpx.Limits(max_connections=REQUESTS)) as client:
        for _ in range(ROUNDS):
            created = post(client, {"type": "create_payment", "amount": "99.99", "currency": "USD", "account": "a"})
            assert created.status_code == 201, created.text
            payment = created.json()["aggregate_id"]
            submitted = post(client, {"type": "submit_payment", "payment_id": payment, "expected_version": 1})
            assert submitted.status_code == 200 and submitted.json()["version"] == 2, submitted.text
            before = count_rows(pg_dsn, schema)

            # complete or fail, all at version 2: two different transitions racing for the same version
            commands = [{"type": "complete_payment", "payment_id": payment, "expected_version": 2} if i % 2 else
                        {"type": "fail_payment", "payment_id": payment, "reason": "declined", "expected_version": 2}
                        for i in range(REQUESTS)]
            barrier = threading.Barrier(REQUESTS)
            responses: list[httpx.Response | BaseException | None] = [None] * REQUESTS

            def send(i: int) -> None:
                barrier.wait()
                try:
                    responses[i] = post(client, commands[i])
                except BaseException as e:  # counted below as "other"
                    responses[i] = e

            threads = [threading.Thread(target=send, args=(i,)) for i in range(REQUESTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

            def kind(r: httpx.Response | BaseException | None) -> str:
                if isinstance(r, httpx.Response) and r.status_code == 200:
                    return "ok"
                if isinstance(r, httpx.Response) and r.status_code == 409 and r.json()["code"] == CONFLICT:
                    return "conflict"
                return "other"

            kinds = Counter(kind(r) for r in responses)
            others = [r if isinstance(r, BaseException) else (r.status_code, r.text)  # type: ignore[union-attr]
                      for r in responses if kind(r) == "other"]
            assert (kinds["ok"], kinds["conflict"], kinds["other"]) == (1, REQUESTS - 1, 0), others[:3]

            (winner,) = [r for r in responses if kind(r) == "ok"]
            assert isinstance(winner, httpx.Response)
            body = winner.json()
            assert body["version"] == 3 and body["events"][0]["type"] in ("PaymentCompleted", "PaymentFailed")
            for r in responses:
                if kind(r) == "conflict":
                    assert isinstance(r, httpx.Response)
                    problem = r.json()
                    assert r.headers["content-type"] == "application/problem+json"
                    assert (problem["aggregate_id"], problem["expected_version"], problem["actual_version"]) == (
                        payment, 2, 3)
            after = count_rows(pg_dsn, schema)
            assert after["events"] == before["events"] + 1
            assert after["idempotency_keys"] == before["idempotency_keys"] + 1


def test_one_of_fifty_concurrent_transitions_wins(server: Server, pg_dsn: str, schema: str) -> None:
    race(server, pg_dsn, schema)


def test_one_of_fifty_wins_across_two_worker_processes(pg_dsn: str, schema: str, tmp_path: Path) -> None:
    # a small pool per worker: the test PostgreSQL is shared, and 50 requests need no more to be decided
    running = start_server(pg_dsn, schema, tmp_path / "serve.log", "--workers", "2", "--no-access-log",
                           COMMITLINE_POOL_SIZE="4", COMMITLINE_POOL_MAX_OVERFLOW="16", COMMITLINE_POOL_TIMEOUT_S="60")
    try:
        race(running, pg_dsn, schema)
        pids = running.output()
        assert pids.count("Started server process") >= 2, pids  # two worker processes served
    finally:
        running.stop()
