"""``commitline demo`` run as a real process never writes into a configured database's schema: refused
without ``--into-configured-database``, and with it confined to ``<COMMITLINE_SCHEMA>_demo``."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
from psycopg import sql

from commitline.composition import bootstrap
from tests.support import count_rows, settings_for


def demo(pg_dsn: str, schema: str, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema, **variables}
    return subprocess.run([sys.executable, "-m", "commitline.cli", "demo", *args], capture_output=True, text=True,
                          env=env, timeout=900)


def schema_exists(pg_dsn: str, schema: str) -> bool:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() == (1,)


def rows_per_table(pg_dsn: str, schema: str) -> dict[str, int]:
    """Every table of ``schema`` with its row count."""
    with psycopg.connect(pg_dsn) as conn:
        tables = [t for (t,) in conn.execute("SELECT table_name FROM information_schema.tables "
                                             "WHERE table_schema = %s", (schema,))]
        return {t: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, t))).fetchone()[0]
                for t in tables}


def test_demo_refuses_a_configured_database_without_the_flag(pg_dsn: str, schema: str) -> None:
    out = demo(pg_dsn, schema)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--into-configured-database" in out.stderr and f"{schema}_demo" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert not schema_exists(pg_dsn, schema) and not schema_exists(pg_dsn, f"{schema}_demo")


def test_demo_with_the_flag_writes_only_into_its_own_schema(pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema, pool_size=1)) as app:  # a configured store already in use
        app.dispatch({"type": "create_survey_task", "title": "production"}, idempotency_key="prod-1")
    before = rows_per_table(pg_dsn, schema)
    assert before["events"] == 1
    demo_schema = f"{schema}_demo"
    try:
        out = demo(pg_dsn, schema, "--into-configured-database", KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
                   COMMITLINE_KAFKA_IDEMPOTENCE="false", COMMITLINE_KAFKA_TOPIC_PREFIX=f"{schema}.")
        assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
        assert f"schema {demo_schema}" in out.stdout
        assert f"{schema}.demo.PaymentTransaction" in out.stdout  # its own topics too
        assert rows_per_table(pg_dsn, schema) == before
        written = count_rows(pg_dsn, demo_schema)
        assert written["events"] > 500 and written["idempotency_keys"] > 500  # 500 survey answers alone
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(demo_schema)))


def test_demo_without_a_master_key_stops_before_it_writes_a_row(pg_dsn: str, schema: str) -> None:
    """The examples' personal fields need COMMITLINE_MASTER_KEY with a configured database: the demo says so at
    its start, not after writing thousands of survey events."""
    demo_schema = f"{schema}_demo"
    try:
        out = demo(pg_dsn, schema, "--into-configured-database", COMMITLINE_MASTER_KEY="")
        assert out.returncode == 3, (out.stdout[-3000:], out.stderr[-3000:])
        assert "demo: not started, nothing was written" in out.stderr and "COMMITLINE_MASTER_KEY" in out.stderr
        assert "Traceback" not in out.stderr
        assert count_rows(pg_dsn, demo_schema)["events"] == 0
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(demo_schema)))
