"""PostgreSQL goes away (a clean stop, or SIGKILL of the postmaster) and comes back on the same data and
port: every call that needs it raises StoreUnavailable within the pool timeout, never a raw driver error;
the same command with the same key then applies exactly once; followers ride the outage out."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from commitline.application.errors import StoreUnavailable
from commitline.composition import Commitline, bootstrap
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from tests.support import FollowerThread, settings_for, wait_for

pytestmark = pytest.mark.integration

POOL_TIMEOUT = 2.0
PASSWORD = "s3cret-pw"  # the embedded server trusts every login; the password only has to stay unprinted
SCHEMA = "outage"
PAYMENT = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-42"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(tmp_path / "pg")  # its own server: the session-wide one must never stop
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


def url_with_password(pg: EmbeddedPostgres) -> str:
    return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{pg.port}/{pg.database}"


@pytest.fixture
def app(server: EmbeddedPostgres) -> Iterator[Commitline]:
    with bootstrap(settings_for(url_with_password(server), SCHEMA, pool_timeout_s=POOL_TIMEOUT)) as commitline:
        yield commitline


def unavailable(call: Callable[[], Any]) -> StoreUnavailable:
    """The StoreUnavailable ``call`` raises, well within the pool timeout's reach."""
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as raised:
        call()
    took = time.monotonic() - started
    assert took < 3 * POOL_TIMEOUT, f"{took:.1f} s to report the outage"
    assert PASSWORD not in str(raised.value) and raised.value.code == "store_unavailable"
    return raised.value


def events_of(pg: EmbeddedPostgres, aggregate_id: object) -> list[int]:
    with psycopg.connect(pg.dsn) as conn:
        return [v for (v,) in conn.execute(f"SELECT originator_version FROM {SCHEMA}.events WHERE originator_id = %s "
                                           "ORDER BY originator_version", (aggregate_id,))]


@pytest.mark.parametrize("outage", ["stop", "kill"])
def test_an_outage_is_store_unavailable_everywhere_and_the_retry_applies_once(
        server: EmbeddedPostgres, app: Commitline, outage: str) -> None:
    created = app.dispatch(PAYMENT, idempotency_key="pay-1")
    submit = {"type": "submit_payment", "payment_id": str(created.aggregate_id)}
    getattr(server, outage)()  # "kill" is SIGKILL of the postmaster: a crash

    errors = [
        unavailable(lambda: app.dispatch(submit, idempotency_key="submit-1")),  # a broken pooled connection
        unavailable(lambda: app.dispatch(submit, idempotency_key="submit-1")),  # no connection within the timeout
        unavailable(lambda: app.auditor().history(created.aggregate_id)),
        unavailable(app.status),
        unavailable(lambda: app.read_models().payment_totals()),
    ]
    assert all(f"127.0.0.1:{server.port}" in str(e) for e in errors)

    server.start()  # same data folder, same port
    result = app.dispatch(submit, idempotency_key="submit-1")
    assert (result.version, result.replayed) == (2, False)
    assert app.dispatch(submit, idempotency_key="submit-1").replayed
    assert events_of(server, created.aggregate_id) == [1, 2]
    assert [e.type for e in app.auditor().history(created.aggregate_id).entries] == [
        "PaymentCreated", "PaymentSubmitted"]


def test_a_connection_lost_during_commit_is_store_unavailable_and_the_retry_applies_once(
        server: EmbeddedPostgres, app: Commitline) -> None:
    created = app.dispatch(PAYMENT, idempotency_key="pay-1")
    submit = {"type": "submit_payment", "payment_id": str(created.aggregate_id)}
    app.recorder.before_commit = server.stop  # the events and key are inserted; the COMMIT never gets through

    unavailable(lambda: app.dispatch(submit, idempotency_key="submit-1"))

    app.recorder.before_commit = None
    server.start()
    assert app.dispatch(submit, idempotency_key="submit-1").version == 2
    assert app.dispatch(submit, idempotency_key="submit-1").replayed
    assert events_of(server, created.aggregate_id) == [1, 2]


def test_cli_dispatch_against_a_server_that_is_down_exits_3_with_a_typed_error(server: EmbeddedPostgres) -> None:
    server.stop()
    env = {**os.environ, "COMMITLINE_DATABASE_URL": url_with_password(server), "COMMITLINE_SCHEMA": SCHEMA,
           "COMMITLINE_POOL_TIMEOUT_S": str(POOL_TIMEOUT)}
    out = subprocess.run([sys.executable, "-m", "commitline.cli", "dispatch", "-k", "cli-1", orjson.dumps(PAYMENT)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 3 and out.stdout == ""
    assert "Traceback" not in out.stderr and PASSWORD not in out.stderr
    error = orjson.loads(out.stderr.strip().splitlines()[-1])
    assert (error["error"], error["code"]) == ("StoreUnavailable", "store_unavailable")


def test_a_projector_rides_out_a_postgres_restart_and_catches_up(
        server: EmbeddedPostgres, app: Commitline, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    def logged(text: str) -> int:
        return sum(text in r.getMessage() for r in caplog.records if r.name == "commitline.projections.projector")


    with FollowerThread(lambda: app.projector("payment_states", poll_interval=0.2)) as follower:
        app.dispatch(PAYMENT, idempotency_key="pay-1")
        follower.wait_until_at(app.recorder.max_notification_id() or 0)

        server.kill()
        wait_for(lambda: logged("retrying with back-off") == 1, "the outage to be logged")
        wait_for(lambda: follower.follower.store_outage.failures >= 3, "a few attempts in back-off")
        server.start()
        app.dispatch({**PAYMENT, "account": "acc-43"}, idempotency_key="pay-2")
        follower.wait_until_at(app.recorder.max_notification_id() or 0)
        assert follower.error is None

    assert logged("retrying with back-off") == 1 and logged("available again") == 1
    [total] = app.read_models().payment_totals()
    assert total.payments == 2


def test_an_outage_shorter_than_the_supervision_is_logged_once(
        server: EmbeddedPostgres, app: Commitline, caplog: pytest.LogCaptureFixture) -> None:
    """A short outage (a fast failover) between two supervision checks: the first round after it reads nothing
    and never touches the fenced lease session, still on the server that went away. The outage ends only once
    that session stands again, so the next page (which must prove it) does not begin a second outage."""
    caplog.set_level(logging.INFO)

    def logged(text: str) -> int:
        return sum(text in r.getMessage() for r in caplog.records if r.name == "commitline.projections.projector")

    def slow_supervision() -> Any:
        projector = app.projector("payment_states", poll_interval=0.05)
        projector.supervise_seconds = 600  # no supervision check between the kill and the next page
        return projector

    with FollowerThread(slow_supervision) as follower:
        app.dispatch(PAYMENT, idempotency_key="pay-1")
        follower.wait_until_at(app.recorder.max_notification_id() or 0)

        server.kill()
        wait_for(lambda: logged("retrying with back-off") == 1, "a round to fail")
        server.start()
        wait_for(lambda: logged("available again") == 1, "the outage to end")
        app.dispatch({**PAYMENT, "account": "acc-43"}, idempotency_key="pay-2")
        follower.wait_until_at(app.recorder.max_notification_id() or 0)
        assert follower.error is None

    assert logged("retrying with back-off") == 1 and logged("available again") == 1
