"""Idempotency records that refer to their command's events (migration 14): a replay in a new application (no
cache, nothing kept from the first answer) reads the events back and answers the first answer's JSON byte for byte,
for a command of each example domain, personal fields included, and an erased subject's as ``{"erased": true}``;
a record from before (holding its outcome) still answers with it; a record whose events are not there, or not its
tenant's, is refused loudly (``IdempotencyRecordBroken``) and nothing is written."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest

from commitline.application.dispatching import fingerprint
from commitline.application.ports import IdempotencyRecordBroken
from commitline.composition import Commitline, bootstrap
from tests.support import count_rows, parse_command, settings_for

pytestmark = pytest.mark.integration
ACCOUNT = "GB33BUKB20201555555555"


def commands(app: Commitline) -> dict[str, dict[str, Any]]:
    """A command of each example domain (and a few with several events or list payloads), dispatched in turn;
    each key with its command. Later commands use the ids the earlier ones created."""
    dispatched: dict[str, dict[str, Any]] = {}

    def do(key: str, command: dict[str, Any]) -> UUID:
        dispatched[key] = command
        return app.dispatch(command, idempotency_key=key).aggregate_id

    payment = do("create", {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": ACCOUNT})
    do("submit", {"type": "submit_payment", "payment_id": str(payment)})
    item = uuid4()
    do("stock", {"type": "receive_stock", "item_id": str(item), "quantity": 7})
    do("reserve", {"type": "reserve_stock", "item_id": str(item), "reservation_id": "r1", "quantity": 2})
    task = do("task", {"type": "create_survey_task", "title": "Ünïcode \u2603 title"})
    do("issue", {"type": "issue_survey_task", "task_id": str(task), "user_ids": ["a", "b", "c"]})
    do("order", {"type": "place_order", "item_id": str(item), "quantity": 1, "amount": "20.00", "currency": "EUR",
                 "account": "acct"})
    return dispatched


def record(pg_dsn: str, schema: str, key: str) -> tuple[Any, ...]:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f'SELECT outcome, event_count, aggregate_type, length(fingerprint) FROM "{schema}".'
                           "idempotency_keys WHERE tenant = 'default' AND key = %s", (key,)).fetchone()
    assert row is not None
    return tuple(row)


def test_a_replay_in_a_new_application_answers_the_first_answers_bytes(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        sent = commands(app)
        first = {key: app.dispatch(command, idempotency_key=key) for key, command in sent.items()}
        assert all(r.replayed for r in first.values())  # replayed once already, by this application
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        # The first answers, as given before any replay (the replays above equal them, checked below).
        for key, command in sent.items():
            again = app.dispatch(command, idempotency_key=key)
            assert again.replayed
            assert again.outcome_bytes() == first[key].outcome_bytes(), key
            outcome, count, aggregate_type, fingerprint_bytes = record(pg_dsn, schema, key)
            assert outcome is None and count == len(again.events) > 0 and aggregate_type is None
            assert fingerprint_bytes == 16
        created = first["create"].outcome_bytes()
        assert ACCOUNT.encode() in created
        payment = str(first["create"].aggregate_id)
        app.erase("default", payment, by="the test")
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        replayed = app.dispatch(sent["create"], idempotency_key="create")
        assert replayed.outcome_bytes() == created.replace(f'"{ACCOUNT}"'.encode(), b'{"erased":true}')
        assert app.dispatch(sent["submit"], idempotency_key="submit").outcome_bytes() == first["submit"].outcome_bytes()


def test_the_first_answer_is_the_replays_bytes(app: Commitline) -> None:
    command = {"type": "create_payment", "amount": "3.10", "currency": "EUR", "account": ACCOUNT}
    answer = app.dispatch(command, idempotency_key="first")
    assert not answer.replayed
    app.store.cache.clear()
    assert app.dispatch(command, idempotency_key="first").outcome_bytes() == answer.outcome_bytes()


def test_a_record_from_before_holding_its_outcome_still_answers_with_it(app: Commitline, pg_dsn: str,
                                                                         schema: str) -> None:
    command = {"type": "receive_stock", "item_id": str(uuid4()), "quantity": 3}
    answer = app.dispatch(command, idempotency_key="now")
    old = answer.outcome_bytes().replace(b'"quantity":3', b'"quantity":3,"noted":"as stored then"')
    with psycopg.connect(pg_dsn) as conn:  # the layout of migrations 1 to 13: the outcome, a full fingerprint
        conn.execute(f'INSERT INTO "{schema}".idempotency_keys (tenant, key, fingerprint, command_type, aggregate_id, '
                     "stream_version, outcome) VALUES ('default', 'then', %s, 'receive_stock', %s, 1, %s)",
                     (fingerprint(parse_command(command)), answer.aggregate_id, old))
    replayed = app.dispatch(command, idempotency_key="then")
    assert replayed.replayed and replayed.outcome_bytes() == old
    with pytest.raises(Exception, match="already used for a different"):
        app.dispatch({**command, "quantity": 4}, idempotency_key="then")


@pytest.mark.parametrize("case", ["missing events", "another tenant's events", "no reference"])
def test_a_record_whose_events_are_not_there_is_refused_loudly(app: Commitline, pg_dsn: str, schema: str,
                                                                case: str) -> None:
    item = uuid4()
    command = {"type": "receive_stock", "item_id": str(item), "quantity": 1}
    theirs = app.dispatch(command, idempotency_key="theirs", tenant="other")
    version, count, tenant = {"missing events": (3, 2, "default"), "another tenant's events": (1, 1, "default"),
                              "no reference": (1, None, "default")}[case]
    aggregate = theirs.aggregate_id if case != "missing events" else app.dispatch(
        {"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="mine").aggregate_id
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f'INSERT INTO "{schema}".idempotency_keys (tenant, key, fingerprint, command_type, aggregate_id, '
                     "stream_version, event_count) VALUES (%s, 'broken', %s, 'receive_stock', %s, %s, %s)",
                     (tenant, fingerprint(parse_command(command)), aggregate, version, count))
    before = count_rows(pg_dsn, schema)
    with pytest.raises(IdempotencyRecordBroken) as refused:
        app.dispatch(command, idempotency_key="broken")
    assert refused.value.key == "broken" and refused.value.tenant == "default"
    assert count_rows(pg_dsn, schema) == before
    with pytest.raises(IdempotencyRecordBroken):  # a twin's lookup reads the same record
        app.store.find_outcome("default", "broken").answer()  # type: ignore[union-attr]


def test_the_cli_names_a_broken_record_as_a_fault_of_the_store(app: Commitline, pg_dsn: str, schema: str) -> None:
    """``dispatch`` of a key whose record cannot be replayed: its typed error on stderr without a traceback, exit 3
    (the store, not the request), for one command and for a line of stdin (named by its number)."""
    import os
    import subprocess
    import sys

    import orjson

    command = {"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}
    aggregate = app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1},
                             idempotency_key="mine").aggregate_id
    with psycopg.connect(pg_dsn) as conn:  # says the command took a one-event stream to version 3
        conn.execute(f'INSERT INTO "{schema}".idempotency_keys (tenant, key, fingerprint, command_type, aggregate_id, '
                     "stream_version, event_count) VALUES ('default', 'broken', %s, 'receive_stock', %s, 3, 2)",
                     (fingerprint(parse_command(command)), aggregate))
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    before = count_rows(pg_dsn, schema)
    for args, stdin in ((["-k", "broken", orjson.dumps(command).decode()], None),
                        ([], orjson.dumps({"command": {"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1},
                                           "idempotency_key": "fine"}) + b"\n" +
                         orjson.dumps({"command": command, "idempotency_key": "broken"}) + b"\n")):
        out = subprocess.run([sys.executable, "-m", "commitline.cli", "dispatch", *args], input=stdin,
                             capture_output=True, env=env, timeout=120)
        stderr = out.stderr.decode()
        assert out.returncode == 3 and "Traceback" not in stderr, (out.returncode, stderr)
        error = orjson.loads(stderr.strip().splitlines()[-1])
        assert (error["code"], error["details"]["idempotency_key"]) == ("idempotency_record_broken", "broken"), error
        assert "audit verify" in error["message"] and "either way" not in error["message"], error
        after = count_rows(pg_dsn, schema)
        if stdin is None:
            assert after == before  # nothing written
        else:
            assert error["line"] == 2, error
            # at most the good line before it (its key answers the same when the input is run again)
            assert all(after[t] - before[t] <= 1 for t in ("events", "idempotency_keys")), (before, after)


def test_the_retention_jobs_filter_has_its_index(app: Commitline, pg_dsn: str, schema: str) -> None:
    """``idempotency expire`` finds expired records through the BRIN index on ``recorded_at`` (here with sequential
    scans priced out, as on a table of millions of rows where the index is the cheap way), not the primary key."""
    for n in range(3):
        app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key=f"r{n}")
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            f'EXPLAIN DELETE FROM "{schema}".idempotency_keys WHERE (tenant, key) IN (SELECT tenant, key FROM '
            f'"{schema}".idempotency_keys WHERE recorded_at < now() - interval \'7 days\' LIMIT 5000)'))
    assert "Bitmap Index Scan on idempotency_keys_recorded_at_idx" in plan, plan
