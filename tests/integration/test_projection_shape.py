"""A projection whose tables have another shape than it declares writes nothing into them: it records the
differences and the rebuild command, and waits, while the other projections of its process run; once that
rebuild swapped tables of its shape in, it goes on by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from decimal import Decimal
from uuid import uuid4

import orjson
import psycopg
import pytest

from commitline.composition import Commitline
from commitline.composition.status import FollowerStatus
from tests.integration.test_cli import commitline
from tests.support import FollowerThread, wait_for

NAME = "payment_states"
COMMAND = f"commitline projections rebuild {NAME}"



def projector(app: Commitline) -> FollowerThread:
    return FollowerThread(lambda: app.projector(NAME, poll_interval=0.2))


def pay(app: Commitline, amount: str) -> None:
    created = app.dispatch({"type": "create_payment", "amount": amount, "currency": "EUR", "account": "a"},
                           idempotency_key=str(uuid4()))
    app.dispatch({"type": "submit_payment", "payment_id": str(created.aggregate_id)}, idempotency_key=str(uuid4()))


def head(app: Commitline) -> int:
    return app.recorder.max_notification_id() or 0


def columns(pg_dsn: str, schema: str, table: str) -> dict[str, str]:
    with psycopg.connect(pg_dsn) as conn:
        return dict(conn.execute("SELECT column_name, udt_name FROM information_schema.columns "
                                 "WHERE table_schema = %s AND table_name = %s", (schema, table)).fetchall())


def totals(pg_dsn: str, schema: str) -> list[tuple]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f"SELECT state, payments, amount FROM {schema}.rm_payment_totals WHERE payments > 0 "
                            "ORDER BY state").fetchall()


def project_everything(app: Commitline) -> None:
    with projector(app) as thread:
        thread.wait_until_at(head(app))


def follower(app: Commitline, name: str = NAME) -> FollowerStatus | None:
    return next((s for s in app.status().followers if s.name == name), None)


def refused(app: Commitline) -> dict:
    """The error a projector records when its tables need a rebuild (it then waits, writing nothing)."""
    with projector(app):
        status = wait_for(lambda: (s := follower(app)) is not None and s.status == "failed" and s.error and
                          s.error.get("needs_rebuild") and s, "the projector to refuse its tables")
    return status.error


@pytest.mark.parametrize("change, difference", [
    ("ALTER TABLE {s}.rm_payments DROP COLUMN currency", "rm_payments.currency is missing"),
    ("ALTER TABLE {s}.rm_payments ADD COLUMN fee numeric", "rm_payments.fee is not declared"),
    ("ALTER TABLE {s}.rm_payment_totals ALTER COLUMN payments TYPE int4", "rm_payment_totals.payments is int4, "
                                                                          "declared int8"),
    ("DROP TABLE {s}.rm_payment_totals", "table rm_payment_totals is missing"),
])
def test_a_projection_whose_tables_changed_shape_refuses_to_start_until_rebuilt(
        app: Commitline, pg_dsn: str, schema: str, change: str, difference: str) -> None:
    pay(app, "2.00")
    project_everything(app)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(change.format(s=schema))
    shape_before = columns(pg_dsn, schema, "rm_payments"), columns(pg_dsn, schema, "rm_payment_totals")
    pay(app, "3.00")

    error = refused(app)
    assert difference in error["needs_rebuild"] and difference in error["message"]
    assert f"`{COMMAND}`" in error["message"] and error["command"] == COMMAND
    assert (columns(pg_dsn, schema, "rm_payments"), columns(pg_dsn, schema, "rm_payment_totals")) == shape_before
    listed = commitline(["projections", "list", "--json"], pg_dsn, schema)
    assert listed.returncode == 0, listed.stderr
    (row,) = [r for r in orjson.loads(listed.stdout)["projections"] if r["name"] == NAME]
    assert row["status"] == "needs rebuild" and difference in row["needs_rebuild"]
    assert row["rebuild_command"] == COMMAND
    table = commitline(["projections", "list"], pg_dsn, schema)
    assert "needs rebuild" in table.stdout and NAME in table.stdout, table.stdout + table.stderr
    # `commitline project` runs the other projection meanwhile, and goes on with this one after the rebuild
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    project = subprocess.Popen([sys.executable, "-m", "commitline.cli", "project", NAME, "inventory_levels"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (s := follower(app, "inventory_levels")) is not None and s.status == "running" and
                 s.position == head(app), "the other projection to run up to the head")
        assert follower(app).status == "failed"  # still waiting, its tables untouched
        assert (columns(pg_dsn, schema, "rm_payments"), columns(pg_dsn, schema, "rm_payment_totals")) == \
            shape_before
        rebuilt = commitline(["projections", "rebuild", NAME], pg_dsn, schema)  # while the process runs
        assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
        pay(app, "4.00")
        wait_for(lambda: (s := follower(app)) is not None and s.status == "running" and s.position == head(app),
                 "the projection to go on by itself after the rebuild")
    finally:
        project.send_signal(signal.SIGTERM)
        _, stderr = project.communicate(timeout=120)
    assert project.returncode == 0 and COMMAND in stderr and "Traceback" not in stderr, stderr[-3000:]
    told = [line for line in stderr.splitlines() if "the other followers go on" in line]
    assert len(told) == 1, told  # once, not at every look while it waited
    assert totals(pg_dsn, schema) == [("PENDING", 3, Decimal("9.00"))]
    assert follower(app).error is None
    listed = commitline(["projections", "list", "--json"], pg_dsn, schema)
    (row,) = [r for r in orjson.loads(listed.stdout)["projections"] if r["name"] == NAME]
    assert row["needs_rebuild"] == [] and row["status"] != "needs rebuild"


def test_a_first_start_creates_the_tables_and_a_matching_shape_starts_again(app: Commitline, pg_dsn: str,
                                                                             schema: str) -> None:
    pay(app, "1.25")
    project_everything(app)
    pay(app, "1.25")
    project_everything(app)  # a second start on the tables it made: no refusal
    assert totals(pg_dsn, schema) == [("PENDING", 2, Decimal("2.50"))]
