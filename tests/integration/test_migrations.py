"""The versioned schema: starts read the version instead of running DDL; migrations upgrade in place."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from uuid import uuid4

import orjson
import psycopg
import pytest
from eventsourcing.postgres import PostgresDatastore

from commitline.application.errors import StoreUnavailable
from commitline.composition import Commitline, bootstrap
from commitline.infrastructure import migrations
from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.store.recorder import EventRecorder
from tests.integration.test_cli import commitline
from tests.support import count_rows, settings_for


def version(pg_dsn: str, schema: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        return migrations.schema_version(conn, schema)


def test_a_fresh_schema_is_migrated_at_start_and_check_says_so(app: Commitline, pg_dsn: str, schema: str) -> None:
    assert version(pg_dsn, schema) == migrations.LATEST
    check = commitline(["migrate", "--check", "--json"], pg_dsn, schema)
    assert check.returncode == 0, check.stderr
    assert orjson.loads(check.stdout)["pending"] == []
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert migrations.migrate(conn, schema) == []


def create_previous_schema(pg_dsn: str, schema: str) -> None:
    """What commitline did at every start before migrations existed: IF NOT EXISTS DDL, no version table."""
    settings = settings_for(pg_dsn, schema)
    parts = settings.connection_parts()
    datastore = PostgresDatastore(parts["dbname"], parts["host"], parts["port"], parts["user"], parts["password"],
                                  schema=schema)
    try:
        EventRecorder(datastore).create_table()
        with datastore.get_connection() as conn:
            for statement in Positions(schema).create_statements():
                conn.execute(statement)
    finally:
        datastore.close()


def test_a_store_from_before_migrations_is_upgraded_in_place_losing_nothing(pg_dsn: str, schema: str) -> None:
    create_previous_schema(pg_dsn, schema)
    assert version(pg_dsn, schema) == 0
    with bootstrap(settings_for(pg_dsn, schema), apply_migrations=False) as old:
        created = old.dispatch({"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "a"},
                               idempotency_key="before-upgrade")
        old.dispatch({"type": "submit_payment", "payment_id": str(created.aggregate_id)}, idempotency_key="submit")
    before = count_rows(pg_dsn, schema)
    check = commitline(["migrate", "--check"], pg_dsn, schema)
    assert check.returncode == 1 and "pending" in check.stdout, check.stdout + check.stderr
    upgraded = commitline(["migrate"], pg_dsn, schema)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "applied migration 1" in upgraded.stdout
    assert version(pg_dsn, schema) == migrations.LATEST
    assert count_rows(pg_dsn, schema) == before
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        assert app.auditor().verify().ok
        replay = app.dispatch({"type": "submit_payment", "payment_id": str(created.aggregate_id)},
                              idempotency_key="submit")
        assert replay.replayed and replay.version == 2


def test_a_store_migrated_by_a_newer_commitline_is_refused(app: Commitline, pg_dsn: str, schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{schema}".schema_migrations (version, description) VALUES (999, %s)',
                     ("from the future",))
    with pytest.raises(StoreUnavailable, match="version 999, newer than this commitline knows"):
        bootstrap(settings_for(pg_dsn, schema))


STARTER = """
import sys, time
from pathlib import Path
from commitline.composition import bootstrap
from tests.support import settings_for
dsn, schema, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
bootstrap(settings_for(dsn, schema, pool_size=1)).close()
"""


@pytest.mark.parametrize("round_", range(5))
def test_twenty_processes_starting_at_once_on_an_empty_schema_all_succeed(pg_dsn: str, round_: int,
                                                                          tmp_path: Path) -> None:
    schema = f"t_first_{uuid4().hex[:10]}"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", STARTER, pg_dsn, schema, str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]) for _ in range(20)]
    try:
        for p in procs:  # every process has imported everything and waits at the line
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        go.touch()
        results = [(p.wait(timeout=180), p.stderr.read() if p.stderr else "") for p in procs]
        assert [code for code, _ in results] == [0] * 20, [err for code, err in results if code][:1]
        assert version(pg_dsn, schema) == migrations.LATEST
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_new_process_never_waits_on_an_open_append(app: Commitline, pg_dsn: str, schema: str) -> None:
    inserted, release = threading.Event(), threading.Event()
    app.recorder.before_commit = lambda: (inserted.set(), release.wait(120))
    held = threading.Thread(target=app.dispatch, args=({"type": "receive_stock", "item_id": str(uuid4()),
                                                        "quantity": 1},), kwargs={"idempotency_key": "held"})
    held.start()
    try:
        assert inserted.wait(30), "the held append never reached its commit"
        status = commitline(["status", "--json"], pg_dsn, schema)
        dispatched = commitline(["dispatch", "-k", "beside", '{"type": "receive_stock", "item_id": "%s", '
                                 '"quantity": 2}' % uuid4()], pg_dsn, schema)
        assert held.is_alive(), "the append must still be open while the other process worked"
        assert status.returncode == 0, status.stderr
        assert dispatched.returncode == 0, dispatched.stderr
    finally:
        release.set()
        held.join(30)
        app.recorder.before_commit = None
    assert count_rows(pg_dsn, schema)["events"] == 2
