"""Rebuilds that always finish: a poison event the operator skipped on the live projection is skipped
again (and recorded), any other stops the rebuild with the exact command that passes it, and an
abandoned rebuild can be discarded."""

from __future__ import annotations

import psycopg
import pytest

from commitline.composition import Commitline
from commitline.infrastructure.followers.interventions import skip
from commitline.projections.rebuild import RebuildError, rebuild_name
from tests.integration.test_cli import commitline
from tests.integration.test_projections import inject_orphan_payment_event, projector
from tests.support import wait_for

NAME = "payment_states"


def pay(app: Commitline, key: str) -> object:
    return app.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": key},
                        idempotency_key=key)


def rows(app: Commitline, sql: str) -> list[tuple]:
    with psycopg.connect(app.settings.database_url.get_secret_value()) as conn:  # type: ignore[union-attr]
        return conn.execute(sql.format(s=app.settings.schema_name)).fetchall()


def test_a_rebuild_skips_what_the_operator_skipped_live_and_equals_the_live_view(app: Commitline) -> None:
    pay(app, "a")
    poison_at = inject_orphan_payment_event(app)
    pay(app, "b")
    with projector(app, NAME) as running:
        wait_for(lambda: running.follower.metrics.poisoned_at is not None, "the projector to meet the poison")
        skip(app.datastore, NAME, poison_at, "orphan event, ticket 42")
        running.wait_until_at(app.recorder.max_notification_id())
    live = rows(app, "SELECT * FROM {s}.rm_payment_totals ORDER BY 1, 2, 3")

    result = app.rebuild(NAME, batch_size=2)
    assert result.position == app.recorder.max_notification_id()
    assert rows(app, "SELECT * FROM {s}.rm_payment_totals ORDER BY 1, 2, 3") == live
    decisions = rows(app, "SELECT name, action, position, detail FROM {s}.follower_interventions ORDER BY id")
    assert [(n, a, p) for n, a, p, _ in decisions] == [(NAME, "skip", poison_at),
                                                      (rebuild_name(NAME), "skip", poison_at)]
    assert decisions[1][3]["follows"]["reason"] == "orphan event, ticket 42"
    assert [r for r in app.status().followers if r.name == rebuild_name(NAME)] == []


def test_a_poison_event_never_skipped_stops_the_rebuild_with_the_command_that_passes_it(app: Commitline) -> None:
    pay(app, "a")
    poison_at = inject_orphan_payment_event(app)
    pay(app, "b")
    with pytest.raises(RebuildError) as stopped:
        app.rebuild(NAME)
    command = f"commitline projections rebuild {NAME} --skip {poison_at}"
    assert command in str(stopped.value)

    refused = commitline(["projections", "rebuild", NAME], app.settings.database_url.get_secret_value(),
                         app.settings.schema_name)
    assert refused.returncode == 1 and command in refused.stderr
    passed = commitline(["projections", "rebuild", NAME, "--skip", str(poison_at), "--reason", "bad import"],
                        app.settings.database_url.get_secret_value(), app.settings.schema_name)
    assert passed.returncode == 0, passed.stderr[-3000:]
    assert rows(app, "SELECT payments FROM {s}.rm_payment_totals WHERE state = 'CREATED'") == [(2,)]
    assert rows(app, "SELECT name, action, position, detail->>'reason' FROM {s}.follower_interventions") == [
        (rebuild_name(NAME), "skip", poison_at, "bad import")]


def test_an_abandoned_rebuild_is_discarded_by_abort(app: Commitline) -> None:
    for key in "abcdef":
        pay(app, key)
    calls = []

    def interrupt(position: int, head: int, applied: int) -> None:
        calls.append(position)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        app.rebuild(NAME, batch_size=2, progress=interrupt)
    assert [r.position for r in app.status().followers if r.name == rebuild_name(NAME)] == [calls[-1]]
    assert rows(app, "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{s}' "
                     "AND table_name LIKE '%\\_\\_next'")[0][0] > 0

    url, schema = app.settings.database_url.get_secret_value(), app.settings.schema_name
    aborted = commitline(["projections", "rebuild", NAME, "--abort"], url, schema)
    assert aborted.returncode == 0 and "aborted" in aborted.stdout, aborted.stderr[-3000:]
    assert [r for r in app.status().followers if r.name == rebuild_name(NAME)] == []
    assert rows(app, "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{s}' "
                     "AND table_name LIKE '%\\_\\_next'") == [(0,)]
    again = commitline(["projections", "rebuild", NAME, "--abort"], url, schema)
    assert again.returncode == 0 and "no rebuild" in again.stdout
    assert app.rebuild(NAME).resumed_from == 0


def test_rebuild_all_from_the_cli_reads_once_and_refuses_an_ambiguous_skip(app: Commitline, pg_dsn: str,
                                                                          schema: str) -> None:
    pay(app, "a")
    done = commitline(["projections", "rebuild", "--all"], pg_dsn, schema)
    assert done.returncode == 0, done.stderr
    rebuilt = [line for line in done.stdout.splitlines() if line.startswith("rebuilt ")]
    assert len(rebuilt) == 4 and all("swapped in atomically" in line for line in rebuilt)
    ambiguous = commitline(["projections", "rebuild", NAME, "task_statuses", "--skip", "3"], pg_dsn, schema)
    assert ambiguous.returncode == 2 and "rebuild that one alone" in ambiguous.stderr
    nothing = commitline(["projections", "rebuild"], pg_dsn, schema)
    assert nothing.returncode == 2 and "--all" in nothing.stderr
