"""A projection whose tables have another shape than it declares refuses to start, naming the differences
and the rebuild command; after that rebuild it runs again."""

from __future__ import annotations

from decimal import Decimal
from uuid import uuid4

import orjson
import psycopg
import pytest

from commitline.composition import Commitline
from commitline.projections.storage import ProjectionNeedsRebuild
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


def refused(app: Commitline) -> ProjectionNeedsRebuild:
    thread = projector(app).start()
    wait_for(lambda: thread.error is not None, "the projector to refuse")
    with pytest.raises(ProjectionNeedsRebuild) as info:
        thread.stop()
    return info.value


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
    assert error.projection == NAME and difference in error.differences
    assert difference in str(error) and f"`{COMMAND}`" in str(error)
    assert (columns(pg_dsn, schema, "rm_payments"), columns(pg_dsn, schema, "rm_payment_totals")) == shape_before
    (status,) = [s for s in app.status().followers if s.name == NAME]
    assert status.status == "failed" and status.error is not None
    assert status.error["command"] == COMMAND and difference in status.error["message"]
    listed = commitline(["projections", "list", "--json"], pg_dsn, schema)
    assert listed.returncode == 0, listed.stderr
    (row,) = [r for r in orjson.loads(listed.stdout)["projections"] if r["name"] == NAME]
    assert row["status"] == "needs rebuild" and difference in row["needs_rebuild"]
    assert row["rebuild_command"] == COMMAND
    table = commitline(["projections", "list"], pg_dsn, schema)
    assert "needs rebuild" in table.stdout and NAME in table.stdout, table.stdout + table.stderr
    project = commitline(["project", NAME], pg_dsn, schema)  # the CLI refuses in words, not a traceback
    assert project.returncode == 1 and COMMAND in project.stderr and "Traceback" not in project.stderr
    # beside another projection: that one stops as on SIGTERM, handing its lease back (never left 'dead')
    project = commitline(["project", NAME, "inventory_levels"], pg_dsn, schema)
    assert project.returncode == 1 and COMMAND in project.stderr and "Traceback" not in project.stderr
    (other,) = [s for s in app.status().followers if s.name == "inventory_levels"]
    assert other.status == "stopped", other

    rebuilt = commitline(["projections", "rebuild", NAME], pg_dsn, schema)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    pay(app, "4.00")
    with projector(app) as thread:
        thread.wait_until_at(head(app))
    assert totals(pg_dsn, schema) == [("PENDING", 3, Decimal("9.00"))]
    (status,) = [s for s in app.status().followers if s.name == NAME]
    assert status.error is None
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
