"""A team's own domain end to end, through real processes: seed 004's portfolio trades (``tests/trades``, a
package outside ``commitline`` written with the public API only) served over HTTP, published by three
``publish`` processes of which one is SIGKILLed and restarted mid-run, projected, rebuilt, audited and
reported on by ``status``, every process choosing the domain with ``COMMITLINE_APP``."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID, uuid4

import httpx
import orjson
import psycopg
import pytest

from commitline.composition import bootstrap
from commitline.infrastructure.kafka.publisher import PUBLISHER
from tests.integration.http.conftest import Server, start_server
from tests.integration.test_partitioned_publishing import consume_everything, stored_events
from tests.support import settings_for, wait_for
from tests.trades import domain as trades
from tests.trades.portfolio import Portfolio, TradeState

BUCKETS = 16
APP = "tests.trades:domain"
ROOT = Path(__file__).parents[3]


def team_env(pg_dsn: str, schema: str, kafka: str) -> dict[str, str]:
    return {"COMMITLINE_APP": APP, "KAFKA_BOOTSTRAP_SERVERS": kafka, "COMMITLINE_KAFKA_IDEMPOTENCE": "false",
            "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}.", "COMMITLINE_KAFKA_PARTITIONS": "4",
            "COMMITLINE_PUBLISH_BUCKETS": str(BUCKETS), "COMMITLINE_PUBLISH_BATCH_SIZE": "50",
            "COMMITLINE_PUBLISH_POLL_INTERVAL_MS": "200"}


def process(server: Server, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "commitline.cli", *args], env=server.env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], env=server.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def published_positions(pg_dsn: str, schema: str) -> list[int]:
    with psycopg.connect(pg_dsn) as conn:
        rows = dict(conn.execute(f"SELECT name, position FROM {schema}.follower_positions WHERE starts_with(name, %s)",
                                 (f"{PUBLISHER}/",)).fetchall())
    return [rows.get(f"{PUBLISHER}/{b:02d}of{BUCKETS}", 0) for b in range(BUCKETS)]


def trade(client: httpx.Client, key: str, body: dict[str, object]) -> httpx.Response:
    return client.post("/v1/commands", json=body, headers={"Idempotency-Key": key})


@pytest.fixture
def team(pg_dsn: str, schema: str, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Server]:
    assert Path.cwd() == ROOT, "the team's processes start from the folder holding its package"
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", **team_env(pg_dsn, schema, kafka_bootstrap))
    yield server
    server.stop()


def test_a_teams_domain_is_served_published_projected_and_audited(
        team: Server, pg_dsn: str, schema: str, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    acme = team.client("acme")

    # OpenAPI describes the team's commands and query, and nothing of the built-in examples
    described = acme.get("/openapi.json").json()
    body = described["paths"]["/v1/commands"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert sorted(ref["$ref"].rsplit("/", 1)[1] for ref in body["oneOf"]) == ["ExecuteTrade", "PlaceTrade",
                                                                             "RejectTrade"]
    assert "CreatePayment" not in described["components"]["schemas"]
    assert "/v1/read-models/trades/{portfolio_id}" in described["paths"]
    assert "unknown_trade" in described["paths"]["/v1/commands"]["post"]["responses"]["404"]["description"]

    portfolios = [uuid4() for _ in range(8)]
    publishers = [process(team, "publish") for _ in range(3)]
    projector = process(team, "project")
    stop, failures, written = threading.Event(), [], defaultdict(int)

    def write(portfolio: UUID) -> None:
        with team.client("acme") as client:
            n = 0
            while not stop.is_set() or n < 30:
                n += 1
                placed = trade(client, f"{portfolio}-p{n}", {"type": "place_trade", "portfolio_id": str(portfolio),
                                                             "trade_id": f"T-{n}", "symbol": "ACME", "side": "buy",
                                                             "quantity": n})
                settle = {"type": "execute_trade", "price": f"{n}.50"} if n % 3 else {"type": "reject_trade",
                                                                                     "reason": "limit"}
                settled = trade(client, f"{portfolio}-s{n}", {**settle, "portfolio_id": str(portfolio),
                                                              "trade_id": f"T-{n}"})
                if (placed.status_code, settled.status_code) not in ((201, 200), (200, 200)):
                    failures.append((placed.status_code, placed.text, settled.status_code, settled.text))
                    return
                written[portfolio] = n

    writers = [threading.Thread(target=write, args=(p,)) for p in portfolios]
    try:
        for writer in writers:
            writer.start()
        wait_for(lambda: sum(published_positions(pg_dsn, schema)) > 100, "the publishers to publish", timeout=120)
        publishers[0].send_signal(signal.SIGKILL)  # mid-run: records sent, positions not all saved
        publishers[0].wait(10)
        publishers[0] = process(team, "publish")
        wait_for(lambda: min(written.values() or [0]) >= 10 and len(written) == len(portfolios), "more trades",
                 timeout=120)
    finally:
        stop.set()
        for writer in writers:
            writer.join(120)
    assert not failures, failures[:3]

    # 50 concurrent requests on one portfolio at one version: one success, 49 conflicts, nothing else
    contended = uuid4()
    for n in range(50):
        assert trade(acme, f"c-{n}", {"type": "place_trade", "portfolio_id": str(contended), "trade_id": f"C-{n}",
                                      "symbol": "ACME", "side": "sell", "quantity": 1}).status_code in (200, 201)
    barrier, statuses = threading.Barrier(50), []

    def race(n: int) -> None:
        with team.client("acme") as client:
            barrier.wait()
            statuses.append(trade(client, f"race-{n}", {"type": "execute_trade", "portfolio_id": str(contended),
                                                        "trade_id": f"C-{n}", "price": "9.99",
                                                        "expected_version": 50}).status_code)

    racers = [threading.Thread(target=race, args=(n,)) for n in range(50)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
    assert sorted(statuses) == [200] + [409] * 49, statuses

    # Kafka: every stored event, per-portfolio order once duplicates are dropped
    with bootstrap(settings_for(pg_dsn, schema), domain=trades) as app:
        head = app.status().head
        wait_for(lambda: min(published_positions(pg_dsn, schema)) >= head, "every bucket to publish the head", 180)
        expected = stored_events(pg_dsn, schema)
        records = consume_everything(kafka_bootstrap, f"{schema}.", [Portfolio])
        seen: set[str] = set()
        last: dict[str, int] = {}
        duplicates = 0
        for _, _, _, envelope in records:
            if envelope["event_id"] in seen:
                duplicates += 1
                continue
            seen.add(envelope["event_id"])
            portfolio, version = envelope["aggregate_id"], envelope["version"]
            assert version == last.get(portfolio, 0) + 1, f"portfolio {portfolio}: {version} after {last.get(portfolio)}"
            assert envelope["aggregate_type"] == "Portfolio" and envelope["schema_version"] == 1
            last[portfolio] = version
        assert seen == set(expected), f"missing from Kafka: {len(set(expected) - seen)}"
        with capsys.disabled():
            print(f"\n[team domain] {len(expected)} events, {duplicates} duplicates after a SIGKILL, 0 missing")

        # the read model, live and rebuilt, equals a recount from the aggregates
        def truth() -> dict[tuple[str, str], str]:
            return {(str(p), t): trade.state.value for p in [*portfolios, contended]
                    for t, trade in app.load(Portfolio, p).trades.items()}

        def book() -> dict[tuple[str, str], str]:
            with psycopg.connect(pg_dsn) as conn:
                rows = conn.execute(f"SELECT portfolio_id, trade_id, state FROM {schema}.rm_trades").fetchall()
            return {(str(p), t): s for p, t, s in rows}

        wait_for(lambda: book() == truth(), "the projector to catch up", timeout=120)
        rebuilt = run(team, "projections", "rebuild", "trade_book")
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert book() == truth()
        assert app.read_models().counts("acme")[TradeState.EXECUTED.value] >= 1  # the domain's own query class
        shown = acme.get(f"/v1/read-models/trades/{contended}").json()
        assert sum(state == "EXECUTED" for state in shown["trades"].values()) == 1

    # the audit: every chain verifies; the state at a version is the domain's aggregate replayed
    verified = run(team, "audit", "verify", "--all", "--json")
    assert verified.returncode == 0 and orjson.loads(verified.stdout)["ok"], verified.stdout + verified.stderr
    at = run(team, "audit", "state", str(contended), "--at-version", "3", "--tenant", "acme", "--json")
    assert at.returncode == 0, at.stderr
    state = orjson.loads(at.stdout)
    assert state["aggregate_type"] == "Portfolio" and state["version"] == 3 and len(state["state"]["trades"]) == 3

    status = run(team, "status", "--json")
    report = orjson.loads(status.stdout)
    assert [f["name"] for f in report["followers"]] == ["kafka-publisher", "trade_book"]
    assert len(report["publisher"]["instances"]) == 3 and report["publisher"]["unowned"] == []
    for proc in [*publishers, projector]:
        proc.send_signal(signal.SIGTERM)
    for proc in [*publishers, projector]:
        assert proc.wait(60) == 0, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
