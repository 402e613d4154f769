"""Audit: history and state at any version or time round-trip against the live state; every way of
editing stored rows behind the application's back is detected and named."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from uuid import UUID, uuid4

import orjson
import psycopg
import pytest

from commitline.application.audit import Auditor, AuditQueryError, BeforeCreation, VersionBeyondHead, state_of
from commitline.application.errors import AggregateNotFound
from commitline.examples.inventory import InventoryItem
from commitline.examples.payments import PaymentTransaction
from commitline.examples.surveys import SurveyAssignment, SurveyTask
from commitline.composition import Commitline, bootstrap
from tests.support import settings_for


def auditor(app: Commitline) -> Auditor:
    return app.auditor()


def run_commands(app: Commitline, tag: str) -> dict[str, tuple[type, UUID, list[dict]]]:
    """A mixed workload; for each aggregate, its state after every version, taken from the live store."""
    seen: dict[str, tuple[type, UUID, list[dict]]] = {}

    def do(label: str, cls: type, command: dict) -> UUID:
        result = app.dispatch(command, idempotency_key=f"{tag}-{label}-{len(seen.get(label, (0, 0, []))[2])}")
        states = seen.setdefault(label, (cls, result.aggregate_id, []))[2]
        states.append(state_of(app.store.load(cls, result.aggregate_id, use_snapshot=False)))
        return result.aggregate_id

    pid = do("payment", PaymentTransaction, {"type": "create_payment", "amount": "10.10", "currency": "EUR",
                                             "account": "acc"})
    for command in ({"type": "submit_payment"}, {"type": "fail_payment", "reason": "declined"},
                    {"type": "submit_payment"}, {"type": "complete_payment"}):
        do("payment", PaymentTransaction, {**command, "payment_id": str(pid)})
    item = str(uuid4())
    do("item", InventoryItem, {"type": "receive_stock", "item_id": item, "quantity": 5})
    for n in range(3):
        do("item", InventoryItem, {"type": "reserve_stock", "item_id": item, "reservation_id": f"r{n}", "quantity": 1})
    do("item", InventoryItem, {"type": "release_reservation", "item_id": item, "reservation_id": "r0"})
    task = do("task", SurveyTask, {"type": "create_survey_task", "title": "t"})
    do("task", SurveyTask, {"type": "issue_survey_task", "task_id": str(task), "user_ids": ["a", "b", "c"]})
    do("task", SurveyTask, {"type": "close_survey_task", "task_id": str(task)})
    return seen


@pytest.fixture
def snapshotting_app(pg_dsn: str, schema: str):
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        yield app


def test_history_and_state_round_trip_for_every_aggregate_type(snapshotting_app: Commitline) -> None:
    app = snapshotting_app
    # the answer must precede the close: answer on a fresh task
    task = app.dispatch({"type": "create_survey_task", "title": "answers"}, idempotency_key="t2").aggregate_id
    app.dispatch({"type": "issue_survey_task", "task_id": str(task), "user_ids": ["u"]}, idempotency_key="i2")
    answer = app.dispatch({"type": "answer_survey_task", "task_id": str(task), "user_id": "u"},
                          idempotency_key="a2").aggregate_id
    seen = run_commands(app, "x")
    seen["answer"] = (SurveyAssignment, answer, [state_of(app.store.load(SurveyAssignment, answer))])
    audit = auditor(app)
    for label, (cls, aggregate_id, states) in seen.items():
        history = audit.history(aggregate_id, compact=False)
        assert history.aggregate_type == cls.__name__
        assert [e.version for e in history.entries] == list(range(1, len(states) + 1))
        assert [e.state_after for e in history.entries] == states, label
        for version, expected in enumerate(states, start=1):
            assert audit.state_at_version(aggregate_id, version).state == expected
        live = state_of(app.store.load(cls, aggregate_id))
        assert audit.state_as_of(aggregate_id, datetime.now(timezone.utc)).state == live
        middle = history.entries[len(states) // 2]
        assert audit.state_as_of(aggregate_id, middle.recorded_at).version == middle.version
    payment_history = audit.history(seen["payment"][1])
    assert [e.transition for e in payment_history.entries] == [
        "payment: (new) -> CREATED", "payment: CREATED -> PENDING", "payment: PENDING -> FAILED",
        "payment: FAILED -> PENDING", "payment: PENDING -> COMPLETED"]
    assert audit.history(seen["item"][1]).entries[-1].transition == "reservation r0: RESERVED -> RELEASED"
    diff = audit.diff(seen["payment"][1], 1, 3)
    assert diff.changed["state"] == ("CREATED", "FAILED") and [e.version for e in diff.events] == [2, 3]


def test_snapshots_never_leak_into_historical_state(snapshotting_app: Commitline, pg_dsn: str, schema: str) -> None:
    app = snapshotting_app
    item = str(uuid4())
    for n in range(7):
        app.dispatch({"type": "receive_stock", "item_id": item, "quantity": 1}, idempotency_key=f"r{n}")
    assert app.store.flush_snapshots(60)  # written behind the commands
    with psycopg.connect(pg_dsn) as conn:  # a wrong snapshot newer than the versions asked about
        bogus = orjson.dumps({"id": item, "version": 6, "on_hand": 999, "reserved": 0, "reservations": {}})
        conn.execute(f"UPDATE {schema}.snapshots SET state = %s WHERE version = 6", (bogus,))
    assert app.store.load(InventoryItem, UUID(item)).on_hand == 1000  # the live path does use snapshots
    audit = auditor(app)
    assert [audit.state_at_version(UUID(item), v).state["on_hand"] for v in range(1, 8)] == [1, 2, 3, 4, 5, 6, 7]


def test_query_errors(app: Commitline) -> None:
    pid = app.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "a"},
                       idempotency_key="k").aggregate_id
    audit = auditor(app)
    with pytest.raises(AggregateNotFound):
        audit.history(uuid4())
    with pytest.raises(VersionBeyondHead):
        audit.state_at_version(pid, 2)
    with pytest.raises(BeforeCreation):
        audit.state_as_of(pid, datetime.now(timezone.utc) - timedelta(days=1))
    with pytest.raises(AuditQueryError):
        audit.state_as_of(pid, datetime.now())


TAMPERING = {
    "payload changed": ("content", 4, [
        "UPDATE {s}.events SET state = convert_to(replace(convert_from(state, 'UTF8'), '\"attempt\":2', "
        "'\"attempt\":7'), 'UTF8') WHERE originator_id = %(id)s AND originator_version = 4"]),
    "event deleted from the middle": ("link", 4, [
        "DELETE FROM {s}.events WHERE originator_id = %(id)s AND originator_version = 3"]),
    "event inserted": ("content", 4, [
        "UPDATE {s}.events SET originator_version = originator_version + 100 "
        "WHERE originator_id = %(id)s AND originator_version >= 3",
        "UPDATE {s}.events SET originator_version = originator_version - 99 "
        "WHERE originator_id = %(id)s AND originator_version >= 100",
        # the forger even computes a valid hash for the inserted event; the shifted ones give it away
        "INSERT INTO {s}.events (originator_id, originator_version, topic, state, prev_hash, event_hash) "
        "SELECT originator_id, 3, 'PaymentCompleted', state, event_hash, sha256(event_hash || "
        "convert_to(originator_id::text, 'UTF8') || '\\x00'::bytea || convert_to('3', 'UTF8') || '\\x00'::bytea || "
        "convert_to('PaymentCompleted', 'UTF8') || '\\x00'::bytea || state) FROM {s}.events "
        "WHERE originator_id = %(id)s AND originator_version = 2"]),
    "two events swapped": ("content", 2, [
        "UPDATE {s}.events SET originator_version = originator_version + 1000 "
        "WHERE originator_id = %(id)s AND originator_version IN (2, 3)",
        "UPDATE {s}.events SET originator_version = CASE originator_version WHEN 1002 THEN 3 ELSE 2 END "
        "WHERE originator_id = %(id)s AND originator_version IN (1002, 1003)"]),
    "last event removed": ("truncated", 5, [
        "DELETE FROM {s}.events WHERE originator_id = %(id)s AND originator_version = 5"]),
    "every event removed": ("truncated", 1, ["DELETE FROM {s}.events WHERE originator_id = %(id)s"]),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_every_tampering_is_detected_and_named(app: Commitline, pg_dsn: str, schema: str, case: str) -> None:
    run_commands(app, "bystander")
    target = app.dispatch({"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "a"},
                          idempotency_key="target").aggregate_id
    for n, command in enumerate(("submit_payment", "fail_payment", "submit_payment", "complete_payment")):
        app.dispatch({"type": command, "payment_id": str(target), **({"reason": "x"} if command == "fail_payment"
                                                                        else {})}, idempotency_key=f"t{n}")
    assert auditor(app).verify().ok, "an untampered store of mixed aggregates verifies clean"
    problem, version, statements = TAMPERING[case]
    with psycopg.connect(pg_dsn) as conn:  # a superuser working around the append-only triggers
        conn.execute("SET session_replication_role = replica")
        for statement in statements:
            conn.execute(statement.format(s=schema), {"id": target})
    report = auditor(app).verify()
    assert not report.ok
    (verdict,) = report.broken
    assert (verdict.aggregate_id, verdict.problem, verdict.version) == (target, problem, version), verdict.detail
    assert verdict.tenant == "default", verdict  # the operator's next command needs it, even with no event left
    single = auditor(app).verify(target)
    assert single.broken == report.broken and single.streams == 1
    if case == "two events swapped":  # replayed, the history makes a move its transition table refuses: shown so
        moves = [e.transition for e in auditor(app).history(target).entries]
        assert moves[1] == "payment: CREATED -> FAILED (NOT ALLOWED by the current transition table)", moves
        assert [m for m in moves if "NOT ALLOWED" in (m or "")] == [moves[1]], moves


def cli(args: list[str], pg_dsn: str, schema: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_cli_audit_commands_and_their_errors(app: Commitline, pg_dsn: str, schema: str) -> None:
    pid = str(run_commands(app, "cli")["payment"][1])
    history = cli(["audit", "history", pid, "--json"], pg_dsn, schema)
    assert history.returncode == 0 and len(orjson.loads(history.stdout)["entries"]) == 5
    table = cli(["audit", "history", pid], pg_dsn, schema)
    assert table.returncode == 0 and "PENDING -> COMPLETED" in table.stdout
    state = orjson.loads(cli(["audit", "state", pid, "--at-version", "3"], pg_dsn, schema).stdout)
    assert state["state"]["state"] == "FAILED" and state["version"] == 3
    diff = orjson.loads(cli(["audit", "diff", pid, "--from", "2", "--to", "5"], pg_dsn, schema).stdout)
    assert diff["changed"]["state"] == {"from": "PENDING", "to": "COMPLETED"}
    verify = cli(["audit", "verify", "--all"], pg_dsn, schema)
    assert verify.returncode == 0 and verify.stdout.startswith("OK:"), verify.stdout + verify.stderr
    assert re.search(r"verified in \d+\.\d ms ", verify.stdout), verify.stdout  # a small store: not "0.0 s"
    for args in (["audit", "history", str(uuid4())],
                 ["audit", "state", pid, "--at-version", "99"],
                 ["audit", "state", pid, "--as-of", "2001-01-01T00:00:00+00:00"],
                 ["audit", "state", "nonsense", "--at-version", "1"],
                 ["audit", "state", pid, "--as-of", "yesterday"],
                 ["audit", "state", pid, "--as-of", "2026-01-01T00:00:00"],
                 ["audit", "state", pid, "--at-version", "0"],
                 ["audit", "state", pid, "--at-version", "-1"],
                 ["audit", "diff", pid, "--from", "-1", "--to", "2"],
                 ["audit", "verify"]):
        out = cli(args, pg_dsn, schema)
        assert (out.returncode, out.stdout) == (2, ""), (args, out.returncode, out.stdout)
        assert out.stderr.strip()
        if "-1" in args or "0" in args:  # below the first version: not "beyond the head"
            assert "versions start at 1" in out.stderr and "beyond" not in out.stderr, (args, out.stderr)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(f"DELETE FROM {schema}.events WHERE originator_id = %s AND originator_version = 2", (pid,))
    broken = cli(["audit", "verify", "--all", "--json"], pg_dsn, schema)
    assert broken.returncode == 1
    assert orjson.loads(broken.stdout)["broken"][0]["aggregate_id"] == pid
    assert orjson.loads(broken.stdout)["broken"][0]["tenant"] == "default"  # the next command needs it: -t default
    table = cli(["audit", "verify", "--all"], pg_dsn, schema)
    assert f"BROKEN {pid} (tenant default): link at version 3" in table.stdout, table.stdout
    checked = cli(["status", "--check"], pg_dsn, schema)  # a scheduled health check sees the broken chain
    assert checked.returncode == 1 and "audit: the verification of every stream at " in checked.stdout + \
        checked.stderr and "found 1 broken stream:" in checked.stdout + checked.stderr, checked
    for args in (["audit", "history", pid], ["audit", "state", pid, "--at-version", "4"],
                 ["audit", "diff", pid, "--from", "1", "--to", "3"]):  # the stream verify flags: a typed answer
        out = cli(args, pg_dsn, schema)
        error = orjson.loads(out.stderr)
        assert out.returncode == 3 and error["code"] == "history_broken" and "Traceback" not in out.stderr, out
        assert "version 2 is not where it belongs" in error["message"] and f"audit verify --aggregate {pid}" in \
            error["message"]
    # a command on that stream (a process meeting it for the first time) gets the same typed answer, nothing written
    out = cli(["dispatch", "-k", "after-the-break", orjson.dumps({"type": "submit_payment", "payment_id": pid}).decode()],
              pg_dsn, schema)
    error = orjson.loads(out.stderr)
    assert out.returncode == 3 and error["code"] == "history_broken" and "Traceback" not in out.stderr, out
    assert "version 2 is not where it belongs" in error["message"], error


def test_the_read_ahead_stops_with_its_reader_and_hands_over_its_errors(app: Commitline, schema: str) -> None:
    """The verifier's pages are read by a thread of their own: a verifier that stops early stops it (its
    connection goes back to the pool), and a failing read fails the verification instead of ending it early."""
    import threading

    from eventsourcing.persistence import ProgrammingError
    from psycopg.sql import Identifier

    from commitline.infrastructure.store import audit_source
    from commitline.infrastructure.store.audit_source import PostgresAuditSource

    run_commands(app, "pages")
    source = PostgresAuditSource(app.recorder, app.codec)
    original = audit_source.PAGE
    audit_source.PAGE = 2  # many pages: the reader is still reading when the verifier stops
    try:
        pages = source.chain_pages(None)
        first = next(pages)
        assert len(first) == 2
        pages.close()
        assert not [t for t in threading.enumerate() if t.name == "commitline-audit-read"]
        assert sum(len(p) for p in source.chain_pages(None)) == source.event_count()
    finally:
        audit_source.PAGE = original
    source.events = Identifier(schema, "no_such_table")
    with pytest.raises(ProgrammingError, match="no_such_table"):
        list(source.chain_pages(None))
    assert not [t for t in threading.enumerate() if t.name == "commitline-audit-read"]


def test_the_record_of_verification_runs_is_append_only(app: Commitline, pg_dsn: str, schema: str) -> None:
    """A BROKEN run deleted or rewritten would leave the status page an earlier OK one to show."""
    run_commands(app, "runs")
    verified = cli(["audit", "verify", "--all"], pg_dsn, schema)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    for change in (f'UPDATE "{schema}".audit_runs SET ok = true', f'DELETE FROM "{schema}".audit_runs',
                   f'TRUNCATE "{schema}".audit_runs'):
        with psycopg.connect(pg_dsn) as conn, pytest.raises(psycopg.errors.RestrictViolation):
            conn.execute(change)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".audit_runs').fetchone() == (1,)
