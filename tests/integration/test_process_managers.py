"""A process manager of a team's own domain that does not park its failures: an instance that keeps failing
is never passed over. Its runner holds at the event that triggered it (``retrying``, the reason in ``status``,
so ``status --check`` is unhealthy), and goes on by itself once the cause is gone, nothing lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import orjson
import pytest

from commitline import AggregateNotFound
from commitline.composition import bootstrap
from tests.domains import forgetful
from tests.support import FollowerThread, settings_for, wait_for

pytestmark = pytest.mark.integration


def test_an_instance_its_process_manager_cannot_park_holds_the_runner_until_it_advances(pg_dsn: str,
                                                                                       schema: str) -> None:
    good, failing, later = uuid4(), uuid4(), uuid4()
    forgetful.FAILING.add(failing)
    forgetful.PAID.clear()
    with bootstrap(settings_for(pg_dsn, schema), domain=forgetful.domain) as app:
        app.dispatch({"type": "approve_loan", "loan_id": str(good)}, idempotency_key="good")
        app.dispatch({"type": "approve_loan", "loan_id": str(failing)}, idempotency_key="failing")
        failing_at = app.recorder.max_notification_id()
        with FollowerThread(lambda: app.process_runner(app.process_manager("payout", backoff=0.01),
                                                       poll_interval=0.2)) as runner:
            (held,) = wait_for(lambda: [s for s in app.status().followers if s.name == "payout"
                                        and s.status == "retrying"], "the runner to hold at the failing instance")
            assert held.position < failing_at, "the failing instance's event is not passed over"
            assert f"payout {failing} kept failing after" in held.error["message"]
            assert "parks no instance" in held.error["message"]
            assert any("retrying at position" in r for r in app.status().reasons(held))
            app.dispatch({"type": "approve_loan", "loan_id": str(later)}, idempotency_key="later")
            forgetful.FAILING.discard(failing)  # the cause fixed: it goes on by itself
            runner.wait_until_at(app.recorder.max_notification_id())
    assert {good, failing, later} <= set(forgetful.PAID)


@pytest.mark.parametrize("park_error", [AggregateNotFound("parked audit", uuid4()), ValueError("reason too long")],
                         ids=["domain-error", "bug"])
def test_an_instance_whose_park_fails_holds_the_runner_until_it_advances(pg_dsn: str, schema: str,
                                                                         park_error: Exception) -> None:
    """Parking records the instance so the runner may pass it over; a park that raises recorded nothing, so passing
    over would lose the instance (it once was passed over after a critical log line, the instance never resumed)."""
    good, failing, parked = uuid4(), uuid4(), uuid4()
    forgetful.FAILING.update({failing, parked})
    forgetful.UNPARKABLE[failing] = park_error
    with bootstrap(settings_for(pg_dsn, schema), domain=forgetful.domain) as app:
        app.dispatch({"type": "approve_loan", "loan_id": str(parked)}, idempotency_key="parked")
        app.dispatch({"type": "approve_loan", "loan_id": str(good)}, idempotency_key="good")
        app.dispatch({"type": "approve_loan", "loan_id": str(failing)}, idempotency_key="failing")
        failing_at = app.recorder.max_notification_id()
        manager = app.process_manager("audit_payout", backoff=0.01)
        with FollowerThread(lambda: app.process_runner(manager, poll_interval=0.2)) as runner:
            (held,) = wait_for(lambda: [s for s in app.status().followers if s.name == "audit_payout"
                                        and s.status == "retrying"], "the runner to hold at the unparkable instance")
            assert held.position < failing_at, "the instance that could not be parked is not passed over"
            assert f"audit_payout {failing} kept failing after" in held.error["message"]
            assert "parking it failed too" in held.error["message"] and str(park_error) in held.error["message"]
            assert parked in forgetful.PARKED, "an instance parked as it should be was passed over"
            forgetful.FAILING.discard(failing)  # the cause fixed: it goes on by itself
            runner.wait_until_at(failing_at)
    assert {good, failing} <= set(forgetful.AUDITED) and failing not in forgetful.PARKED


def test_a_command_meeting_a_defect_in_the_domains_code_prints_an_internal_error_after_its_traceback(
        pg_dsn: str, schema: str) -> None:
    loan = uuid4()
    with bootstrap(settings_for(pg_dsn, schema), domain=forgetful.domain) as app:
        app.dispatch({"type": "approve_loan", "loan_id": str(loan)}, idempotency_key="loan")
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    out = subprocess.run([sys.executable, "-m", "commitline.cli", "--app", "tests.domains.forgetful:domain", "sagas",
                          "retry", "--saga", "audit_payout", str(loan)], capture_output=True, text=True, env=env, timeout=120,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == 1 and out.stdout == "", out
    assert "RuntimeError: the auditor's retry endpoint is down" in out.stderr  # the traceback, logged
    printed = orjson.loads(out.stderr.strip().splitlines()[-1])
    assert (printed["code"], printed["details"]) == ("internal_error", {"exception": "RuntimeError"}), out.stderr
