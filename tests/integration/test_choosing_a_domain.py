"""Every ``commitline`` process runs the domain ``--app module:attribute`` or ``COMMITLINE_APP`` names (the
built-in examples when none is): real processes, started from the project root as a team would start theirs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import psycopg
import pytest

ROOT = Path(__file__).parents[2]
ENTRY_POINTS = [["serve", "--port", "0"], ["dispatch", "-k", "k", "{}"], ["publish"], ["project"], ["sagas", "run"],
                ["projections", "list"], ["audit", "verify", "--all"], ["status"], ["demo"]]


def commitline(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def on_database(pg_dsn: str, schema: str) -> dict[str, str]:
    return {"COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}


@pytest.mark.parametrize(("spec", "says"), [
    ("tests.trades", "must be module:attribute"),
    ("tests.no_such_module:domain", "there is no module 'tests.no_such_module'"),
    ("tests.domains.raising:domain", "importing tests.domains.raising failed: RuntimeError: the team's settings file "
                                     "is missing (tests/domains/raising.py:6)"),
    ("tests.domains.mutable:domain", "importing tests.domains.mutable failed: TypeError: cannot inherit non-frozen "
                                     "dataclass from a frozen one (tests/domains/mutable.py:11)"),
    ("tests.trades:nothing", "module tests.trades has no attribute 'nothing'"),
    ("tests.trades.portfolio:Portfolio", "Portfolio is a class, not a commitline Domain"),
    ("tests.trades:domain.missing", "attribute tests.trades.domain has no attribute 'missing'"),
    ("tests.domains.exiting:domain", "importing tests.domains.exiting exited (sys.exit(5))"),
    ("tests.domains.contradictions:domain", "domain 'contradictions' cannot be used: 11 problems:"),
])
def test_a_path_that_names_no_usable_domain_exits_3_naming_it(spec: str, says: str) -> None:
    for args, env in ((["--app", spec, "status"], {}), (["status"], {"COMMITLINE_APP": spec})):
        done = commitline(*args, env=env)
        assert done.returncode == 3, (args, done.stderr)
        assert spec in done.stderr and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
    assert ("--app" if "--app" in args else "COMMITLINE_APP") in done.stderr


def test_the_contradictions_are_listed_each_with_where_it_is_declared() -> None:
    done = commitline("--app", "tests.domains.contradictions:domain", "projections", "list")
    listed = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert done.returncode == 3 and len(listed) == 11, done.stderr
    assert all(line.startswith("  - tests/domains/contradictions.py:") for line in listed), listed



def test_a_column_type_the_database_does_not_know_is_refused_before_its_table_is_made(pg_dsn: str,
                                                                                      schema: str) -> None:
    for args in (["status"], ["project"], ["projections", "rebuild", "switches"]):
        done = commitline("--app", "tests.domains.typo:domain", *args, env=on_database(pg_dsn, schema))
        assert done.returncode == 3, (args, done.stderr)
        assert re.search(r"tests/domains/typo\.py:\d+: read model switches's table rm_switches: column 'n' has the "
                         r"type 'bigintt', which PostgreSQL does not know", done.stderr), done.stderr
        assert "column 'price' has the type 'numeric(12,2', which PostgreSQL does not know" in done.stderr
        assert "Traceback" not in done.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"{schema}.rm_switches",)).fetchone() == (None,)

@pytest.mark.parametrize("args", ENTRY_POINTS, ids=lambda a: " ".join(a[:2]))
def test_every_entry_point_takes_the_app_before_or_after_its_command(args: list[str]) -> None:
    for argv in (["--app", "tests.no_such_module:domain", *args], [*args, "--app=tests.no_such_module:domain"]):
        done = commitline(*argv, timeout=60)
        assert done.returncode == 3 and "tests.no_such_module:domain" in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr


def test_the_chosen_domain_is_what_the_commands_work_on(pg_dsn: str, schema: str) -> None:
    env = on_database(pg_dsn, schema)
    portfolio = "8f3a7c1e-58a4-4d59-9d7e-0b5a2f6c9e11"
    trade = {"type": "place_trade", "portfolio_id": portfolio, "trade_id": "T-1", "symbol": "ACME", "side": "buy",
             "quantity": 10}
    placed = commitline("--app", "tests.trades:domain", "dispatch", "-t", "acme", "-k", "t-1", orjson.dumps(trade).decode(),
                        env=env)
    assert placed.returncode == 0, placed.stderr
    assert orjson.loads(placed.stdout)["aggregate_type"] == "Portfolio"
    # the same through the variable; the examples' commands are unknown to this domain
    unknown = commitline("dispatch", "-k", "p-1", '{"type": "create_payment", "amount": "1", "currency": "EUR", '
                         '"account": "a"}', env={**env, "COMMITLINE_APP": "tests.trades:domain"})
    assert unknown.returncode == 1 and "unknown_command_type" in unknown.stderr
    assert "place_trade" in orjson.loads(unknown.stderr.splitlines()[-1])["message"]
    listed = commitline("projections", "list", "--json", env={**env, "COMMITLINE_APP": "tests.trades:domain"})
    assert [p["name"] for p in orjson.loads(listed.stdout)["projections"]] == ["trade_book"]
    status = commitline("--app", "tests.trades:domain", "status", "--json", env=env)
    followers = [f["name"] for f in orjson.loads(status.stdout)["followers"]]
    assert followers == ["kafka-publisher", "trade_book"], followers
    no_demo = commitline("--app", "tests.trades:domain", "demo", env=env)
    assert no_demo.returncode == 2 and "declares no demo" in no_demo.stderr
    no_sagas = commitline("--app", "tests.trades:domain", "sagas", "list", env=env)
    assert no_sagas.returncode == 2 and "the domain 'trades' declares no process manager" in no_sagas.stderr


def test_without_a_choice_the_built_in_examples_run(pg_dsn: str, schema: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COMMITLINE_APP"}
    listed = subprocess.run([sys.executable, "-m", "commitline.cli", "projections", "list", "--json"], cwd=ROOT,
                            capture_output=True, text=True, env={**env, **on_database(pg_dsn, schema)}, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert sorted(p["name"] for p in orjson.loads(listed.stdout)["projections"]) == [
        "inventory_levels", "order_fulfilments", "payment_states", "task_statuses"]


def test_every_worker_of_serve_runs_the_chosen_domain(pg_dsn: str, schema: str) -> None:
    import httpx

    from tests.integration.http.conftest import free_port
    from tests.support import wait_for

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "commitline.cli", "serve", "--workers", "2", "--port", str(port),
                               "--app", "tests.trades:domain"], cwd=ROOT, env={**os.environ, **on_database(pg_dsn, schema)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def described() -> dict | None:
            assert server.poll() is None, server.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=5)
            except httpx.TransportError:
                return None
            return answer.json() if answer.status_code == 200 else None

        # several answers, so that both workers (separate processes) are asked
        schemas = [wait_for(described, "serve --workers 2 to answer", timeout=120)["components"]["schemas"]
                   for _ in range(6)]
        assert all("PlaceTrade" in s and "CreatePayment" not in s for s in schemas)
    finally:
        server.terminate()
        server.wait(60)


def test_a_defect_in_a_handler_is_an_internal_error_on_stderr_and_writes_nothing(pg_dsn: str, schema: str) -> None:
    lamp = "3f0c6b1e-2d4a-4c8e-9b7f-1a2b3c4d5e6f"
    done = commitline("--app", "tests.domains.faulty:domain", "dispatch", "-k", "k1",
                      '{"type": "break", "lamp_id": "%s"}' % lamp, env=on_database(pg_dsn, schema))
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert "TypeError" in done.stderr  # the traceback, for whoever fixes the handler
    last = orjson.loads(done.stderr.strip().splitlines()[-1])
    assert last["code"] == "internal_error" and "nothing was written" in last["message"], last
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {schema}.events").fetchone() == (0,)
        assert conn.execute(f"SELECT count(*) FROM {schema}.idempotency_keys").fetchone() == (0,)


def test_a_configuration_error_met_while_a_command_runs_exits_3(pg_dsn: str, schema: str) -> None:
    env = {**on_database(pg_dsn, schema), "COMMITLINE_MASTER_KEY": ""}  # a configured database: no development key
    done = commitline("dispatch", "-k", "p1", '{"type": "create_payment", "amount": "1.00", "currency": "EUR", '
                      '"account": "acc-1"}', env=env)
    assert done.returncode == 3 and orjson.loads(done.stderr)["code"] == "configuration_error", done.stderr


def test_a_port_factory_that_raises_stops_sagas_at_start_naming_it_without_the_password(pg_dsn: str,
                                                                                          schema: str) -> None:
    secret = "pw-never-shown-7"
    with_password = re.sub(r"://([^@/:]+)(:[^@/]*)?@", rf"://\1:{secret}@", pg_dsn)
    assert secret in with_password, "the test database URL names a user"
    done = commitline("--app", "tests.domains.unconnected:domain", "sagas", "run",
                      env={**on_database(with_password, schema)}, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and secret not in done.stderr + done.stdout, done.stderr
    error = orjson.loads(done.stderr.strip().splitlines()[-1])
    assert error["code"] == "configuration_error", error
    assert "port 'carrier'" in error["message"] and "TypeError: a connection string was expected" in error["message"]
    assert "tests/domains/unconnected.py:19" in error["message"], error
    assert "psycopg.connect(**" not in error["message"] and "keyword arguments" in error["message"]
