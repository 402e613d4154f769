"""Crypto-shredding on PostgreSQL: personal fields are stored sealed (never in plain text, in events or stored
outcomes), read back in plain text, and once their subject is erased read as the erased marker everywhere
(loads, audit history, replayed outcomes) while aggregates keep their states and accept commands and every
hash chain still verifies. The master key: missing, wrong or rotated, a typed error, nothing written, no key
in any message or log line."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
import subprocess
import sys
from collections.abc import Iterator
from uuid import UUID, uuid4

import orjson
import psycopg
import pytest

from commitline import ERASED, ConfigurationError, WrongMasterKey
from commitline.composition import Commitline, bootstrap
from commitline.examples.payments import PaymentState, PaymentTransaction
from commitline.infrastructure.personal.master import generate
from tests.domains import customers
from tests.support import MASTER_KEY, count_rows, settings_for

pytestmark = pytest.mark.integration
ACCOUNT = "GB33BUKB20201555555555"


def create(app: Commitline, key: str = "create", tenant: str = "default", account: str = ACCOUNT) -> UUID:
    result = app.dispatch({"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": account},
                          idempotency_key=key, tenant=tenant)
    assert result.events[0].payload["account"] == account  # the caller's own answer
    return result.aggregate_id


def stored_bytes(pg_dsn: str, schema: str) -> bytes:
    """Every byte the store keeps of events, outcomes, snapshots and data keys."""
    with psycopg.connect(pg_dsn) as conn:
        # an idempotency record: its outcome (records from before migration 14) and its text columns
        record = "coalesce(outcome, ''::bytea) || convert_to(concat_ws(' ', key, command_type, aggregate_type), 'UTF8')"
        rows = [bytes(r[0]) for table, column in (("events", "state"), ("idempotency_keys", record),
                                                  ("snapshots", "state"), ("data_keys", "wrapped"))
                for r in conn.execute(f'SELECT {column} FROM "{schema}".{table}')]
    return b"\n".join(rows)


def cli(pg_dsn: str, schema: str, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema, **env}
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], capture_output=True, text=True, timeout=120,
                          input=stdin, env=env)


@pytest.fixture
def customers_app(pg_dsn: str, schema: str) -> Iterator[Commitline]:
    with bootstrap(settings_for(pg_dsn, schema), domain=customers.domain) as app:
        yield app


def test_the_store_holds_no_plain_personal_value_and_a_load_opens_it(app: Commitline, pg_dsn: str, schema: str) -> None:
    first = app.dispatch({"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": ACCOUNT},
                         idempotency_key="create")
    pid = first.aggregate_id
    for move in range(150):  # a long stream: past the snapshot interval (its snapshot is sealed too)
        app.dispatch({"type": "fail_payment" if move % 2 else "submit_payment", "payment_id": str(pid),
                      **({"reason": "declined"} if move % 2 else {})}, idempotency_key=f"move-{move}")
    kept = stored_bytes(pg_dsn, schema)
    assert ACCOUNT.encode() not in kept and b"20201555555555" not in kept
    assert count_rows(pg_dsn, schema)["snapshots"] == 1  # the latest of its 15 (one per 10 of its 151 events)
    with psycopg.connect(pg_dsn) as conn:
        (state,) = conn.execute(f'SELECT state FROM "{schema}".events WHERE originator_version = 1').fetchone()
        (key_id, tenant, subject) = conn.execute(f'SELECT key_id, tenant, subject FROM "{schema}".data_keys').fetchone()
    sealed = orjson.loads(state)
    assert sealed["pd"] == ["account"] and sealed["data"]["account"]["key_id"] == str(key_id)
    assert (tenant, subject) == ("default", str(pid))  # the payment is its own holder
    fresh = bootstrap(settings_for(pg_dsn, schema))  # another process, nothing cached
    with fresh:
        loaded = fresh.load(PaymentTransaction, pid)
        assert loaded.account == ACCOUNT and loaded.version == 151
        again = fresh.dispatch({"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": ACCOUNT},
                               idempotency_key="create")
        assert again.replayed and again.model_dump(exclude={"replayed"}) == first.model_dump(exclude={"replayed"})
        assert again.model_dump_json(exclude={"replayed"}) == first.model_dump_json(exclude={"replayed"})


def test_an_erased_subject_reads_as_erased_while_states_commands_and_chains_hold(app: Commitline, pg_dsn: str,
                                                                                 schema: str) -> None:
    pid = create(app)
    kept = create(app, "other", account="GB94BARC10201530093459")
    app.dispatch({"type": "submit_payment", "payment_id": str(pid)}, idempotency_key="submit")
    assert app.verify_chains().ok

    erased = app.erase("default", str(pid), by="the test")
    assert [(e.tenant, e.subject, e.erased_by) for e in erased] == [("default", str(pid), "the test")]

    payment = app.load(PaymentTransaction, pid)
    assert payment.account is ERASED and payment.state is PaymentState.PENDING and payment.amount == 12.5
    assert app.load(PaymentTransaction, kept).account == "GB94BARC10201530093459"
    history = app.auditor().history(pid)
    assert history.entries[0].payload["account"] == {"erased": True}
    assert history.entries[-1].state_after["account"] == {"erased": True}
    assert history.entries[-1].state_after["state"] == "PENDING"
    completed = app.dispatch({"type": "complete_payment", "payment_id": str(pid)}, idempotency_key="complete")
    assert completed.version == 3 and app.load(PaymentTransaction, pid).state is PaymentState.COMPLETED
    replayed = app.dispatch({"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": ACCOUNT},
                            idempotency_key="create")
    assert replayed.replayed and replayed.events[0].payload == {"amount": "12.50", "currency": "EUR",
                                                                "account": {"erased": True}}
    report = app.verify_chains()
    assert report.ok and report.events == 4
    assert app.erasures("default")[0].key_id == erased[0].key_id
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".data_keys').fetchone() == (1,)
        with pytest.raises(psycopg.errors.RestrictViolation):
            conn.execute(f'DELETE FROM "{schema}".erasures')


def test_a_snapshot_of_an_erased_subject_is_passed_over(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        pid = create(app)
        app.dispatch({"type": "submit_payment", "payment_id": str(pid)}, idempotency_key="submit")
        assert count_rows(pg_dsn, schema)["snapshots"] == 1 and ACCOUNT.encode() not in stored_bytes(pg_dsn, schema)
        with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as fresh:
            assert fresh.load(PaymentTransaction, pid).account == ACCOUNT  # from the sealed snapshot
        app.erase("default", str(pid))
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=3)) as fresh:  # nothing cached
        payment = fresh.load(PaymentTransaction, pid)
        assert payment.account is ERASED and payment.state is PaymentState.PENDING and payment.version == 2
        with warnings.catch_warnings(record=True) as warned:  # version 3 is due a snapshot: not of erased values
            warnings.simplefilter("always")
            done = fresh.dispatch({"type": "complete_payment", "payment_id": str(pid)}, idempotency_key="complete")
            assert fresh.store.flush_snapshots(60)
        assert [str(w.message) for w in warned] == []
        assert done.version == 3 and fresh.verify_chains().ok
    assert count_rows(pg_dsn, schema)["snapshots"] == 1  # the one from before the erasure, unreadable now


def test_a_plain_snapshot_of_a_type_whose_snapshots_are_sealed_is_never_used(pg_dsn: str, schema: str) -> None:
    """A snapshot row replaced by hand with a plain state (a forged one: another state, the account in clear) is
    not decided on: the stream is replayed from its events, as the log holds them."""
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        pid = create(app)
        app.dispatch({"type": "submit_payment", "payment_id": str(pid)}, idempotency_key="submit")
        assert app.store.flush_snapshots(60) and count_rows(pg_dsn, schema)["snapshots"] == 1
    forged = orjson.dumps({"id": str(pid), "version": 2, "state": "FAILED", "amount": "12.50", "currency": "EUR",
                           "account": "PLANTED", "attempts": 5, "failure_reason": "forged"})
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f'UPDATE "{schema}".snapshots SET state = %s WHERE aggregate_id = %s', (forged, pid))
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as fresh:  # nothing cached
        payment = fresh.load(PaymentTransaction, pid)
        assert (payment.state, payment.account, payment.version) == (PaymentState.PENDING, ACCOUNT, 2)
        done = fresh.dispatch({"type": "complete_payment", "payment_id": str(pid)}, idempotency_key="complete")
        assert done.version == 3 and fresh.load(PaymentTransaction, pid).state is PaymentState.COMPLETED


def test_erase_and_audit_from_the_command_line(app: Commitline, pg_dsn: str, schema: str) -> None:
    pid = create(app)
    erased = cli(pg_dsn, schema, "erase", "--tenant", "default", "--subject", str(pid), "--json")
    assert erased.returncode == 0, erased.stderr
    assert orjson.loads(erased.stdout)["erased"][0]["subject"] == str(pid)
    history = cli(pg_dsn, schema, "audit", "history", str(pid), "--json")
    assert history.returncode == 0, history.stderr
    assert orjson.loads(history.stdout)["entries"][0]["payload"]["account"] == {"erased": True}
    verified = cli(pg_dsn, schema, "audit", "verify", "--all")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    nothing = cli(pg_dsn, schema, "erase", "--tenant", "default", "--subject", str(pid))
    assert nothing.returncode == 0 and "nothing to erase" in nothing.stderr
    listed = cli(pg_dsn, schema, "keys", "erasures")
    assert [e["subject"] for e in orjson.loads(listed.stdout)] == [str(pid)]
    as_json = cli(pg_dsn, schema, "keys", "erasures", "--json")  # taken, as by every command: the same JSON
    assert as_json.returncode == 0 and orjson.loads(as_json.stdout) == orjson.loads(listed.stdout), as_json.stderr


def test_an_erasure_leaves_another_tenants_subject_of_the_same_id_untouched(customers_app: Commitline) -> None:
    app = customers_app
    ids = {}
    for tenant in ("acme", "globex"):
        ids[tenant] = app.dispatch({"type": "register_customer", "customer_id": "c-1", "email": f"ann@{tenant}.test"},
                                   idempotency_key="register", tenant=tenant).aggregate_id
    assert [e.subject for e in app.erase("acme", "c-1")] == ["c-1"]
    acme, globex = (app.load(customers.Customer, ids[t]) for t in ("acme", "globex"))
    assert acme.email is ERASED and acme.customer_id == "c-1"
    assert globex.email == "ann@globex.test"
    closed = app.dispatch({"type": "close_customer", "customer": str(ids["acme"])}, idempotency_key="close",
                          tenant="acme")
    assert closed.version == 2 and app.verify_chains().ok


def test_a_missing_master_key_refuses_the_command_and_writes_nothing(pg_dsn: str, schema: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with bootstrap(settings_for(pg_dsn, schema, master_key=None)) as app:
        before = count_rows(pg_dsn, schema)
        with pytest.raises(ConfigurationError) as refused:
            create(app)
        assert refused.value.variable == "COMMITLINE_MASTER_KEY" and "openssl rand" in str(refused.value)
        assert count_rows(pg_dsn, schema) == before
        task = app.dispatch({"type": "create_survey_task", "title": "NPS"}, idempotency_key="task")
        assert task.version == 1  # a command without personal fields is unaffected
    assert MASTER_KEY not in caplog.text
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".data_keys').fetchone() == (0,)


def test_a_wrong_master_key_is_refused_and_writes_nothing(app: Commitline, pg_dsn: str, schema: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    pid = create(app)
    wrong = generate()
    with bootstrap(settings_for(pg_dsn, schema, master_key=wrong)) as other:
        before = count_rows(pg_dsn, schema)
        for attempt in (lambda: other.load(PaymentTransaction, pid), lambda: create(other, "another"),
                        lambda: other.dispatch({"type": "submit_payment", "payment_id": str(pid)},
                                               idempotency_key="submit")):
            with pytest.raises(WrongMasterKey) as refused:
                attempt()
            text = str(refused.value) + orjson.dumps(refused.value.to_dict()).decode()
            assert wrong not in text and MASTER_KEY not in text
        assert count_rows(pg_dsn, schema) == before
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".data_keys').fetchone() == (1,)
    assert wrong not in caplog.text and MASTER_KEY not in caplog.text


def test_a_development_key_that_is_not_the_store_s_names_its_file_not_the_variable(
        app: Commitline, pg_dsn: str, schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store restored into another data folder, whose development key was not copied: that folder makes a key
    of its own, which the store refuses. The refusal says so, and what to copy, instead of blaming an unset
    COMMITLINE_MASTER_KEY."""
    import commitline.composition.wiring as wiring
    from commitline.infrastructure.personal.master import development_key

    create(app)
    monkeypatch.setattr(wiring, "master_key_source", lambda settings: lambda: development_key(tmp_path))
    with bootstrap(settings_for(pg_dsn, schema)) as other:
        before = count_rows(pg_dsn, schema)
        with pytest.raises(WrongMasterKey) as refused:
            create(other, "another")
        assert refused.value.variable == "COMMITLINE_DATA_DIR", refused.value
        assert "the data folder's master-key file" in str(refused.value) and "copy the master-key file" in \
            str(refused.value) and str(tmp_path) not in str(refused.value)  # no server path in an HTTP answer
        assert (tmp_path / "master-key").read_text().strip() not in str(refused.value)
        assert count_rows(pg_dsn, schema) == before


def test_a_wrong_master_key_is_refused_after_every_subject_was_erased(app: Commitline, pg_dsn: str,
                                                                      schema: str) -> None:
    """With no data key left, none can tell a wrong master key by; the record of the master keys in use still
    does, so a process configured with another key neither writes under it nor takes the store over. After a
    rotation the new key is the store's, even before it wrapped anything, and the old one no longer is."""
    pid = create(app)
    app.erase("default", str(pid))
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".data_keys').fetchone() == (0,)
    wrong = generate()
    with bootstrap(settings_for(pg_dsn, schema, master_key=wrong)) as other:
        before = count_rows(pg_dsn, schema)
        with pytest.raises(WrongMasterKey) as refused:
            create(other, "stray")
        assert "every one since erased" in str(refused.value) and wrong not in str(refused.value)
        assert count_rows(pg_dsn, schema) == before
    after = create(app, "after")  # the store's own key goes on working
    app.erase("default", str(after))
    new = generate()
    rotated = cli(pg_dsn, schema, "keys", "rotate", "--json", stdin=new + "\n")  # nothing left to rewrap
    assert rotated.returncode == 0, rotated.stderr
    with bootstrap(settings_for(pg_dsn, schema, master_key=new)) as rotated_app:
        create(rotated_app, "under the new key")
    with bootstrap(settings_for(pg_dsn, schema)) as old:
        with pytest.raises(WrongMasterKey):
            create(old, "under the old key")


def test_the_master_key_is_checked_but_not_recorded_on_a_read_only_server(app: Commitline, pg_dsn: str,
                                                                          schema: str) -> None:
    """A process reading from a hot standby (every transaction read-only) opens personal values as on the
    primary: its key is checked against the record, and nothing is written."""
    from commitline.infrastructure.personal.keys import DataKeys
    from commitline.infrastructure.personal.master import MasterKey

    create(app)  # the record holds the store's key
    keys = DataKeys(lambda: psycopg.connect(pg_dsn, options="-c default_transaction_read_only=on"), schema)
    assert keys.claim_master([MasterKey.parse(MASTER_KEY).key_id]) is None
    assert keys.claim_master([MasterKey.parse(generate()).key_id]) .startswith("no data key is wrapped under it; configure the key that wrapped them")
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".master_keys').fetchone() == (1,)


def test_rotation_rewraps_every_data_key_under_the_new_master_key(app: Commitline, pg_dsn: str, schema: str) -> None:
    pids = [create(app, f"p{n}", account=f"ACC-{n}-{uuid4().hex}") for n in range(3)]
    new = generate()
    bad = cli(pg_dsn, schema, "keys", "rotate", stdin="not a key\n")
    assert bad.returncode == 3 and "not a key" not in bad.stdout + bad.stderr
    rotated = cli(pg_dsn, schema, "keys", "rotate", stdin=new + "\n")
    assert rotated.returncode == 0, rotated.stderr
    assert orjson.loads(rotated.stdout)["rewrapped"] == 3
    assert new not in rotated.stdout + rotated.stderr and MASTER_KEY not in rotated.stdout + rotated.stderr
    again = cli(pg_dsn, schema, "keys", "rotate", "--new-key-env", "NEW_KEY", NEW_KEY=new)
    assert again.returncode == 3 and "wrong_master_key" in again.stderr  # the old key wraps nothing any more
    with bootstrap(settings_for(pg_dsn, schema, master_key=new)) as rotated_app:
        assert all(rotated_app.load(PaymentTransaction, p).account.startswith("ACC-") for p in pids)
        create(rotated_app, "after-rotation")
    with bootstrap(settings_for(pg_dsn, schema)) as old:  # a process still on the old key
        with pytest.raises(WrongMasterKey):
            old.load(PaymentTransaction, pids[0])


def test_a_projection_reads_the_data_keys_of_a_batch_in_one_statement(app: Commitline, pg_dsn: str,
                                                                       schema: str) -> None:
    for n in range(40):  # forty payments: forty data subjects, forty keys
        create(app, key=f"many-{n}", account=f"{ACCOUNT[:-2]}{n:02d}")
    with bootstrap(settings_for(pg_dsn, schema)) as fresh:  # another process: no key held
        keys = fresh.codec.personal.keys
        reads: list[int] = []
        one, many = keys.get, keys.get_many
        keys.get = lambda key_id: reads.append(1) or one(key_id)  # type: ignore[method-assign]
        keys.get_many = lambda key_ids: reads.append(len(key_ids)) or many(key_ids)  # type: ignore[method-assign]
        fresh.rebuild("payment_states")
        assert reads == [40]  # every key of the batch in one read, none one by one
