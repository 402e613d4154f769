"""A rolling rotation of the master key: every process is deployed with the new key in COMMITLINE_MASTER_KEY
and the old one in COMMITLINE_PREVIOUS_MASTER_KEY (it opens data keys wrapped under either, and wraps new ones
under the new key only), then ``commitline keys rotate``, given no new key, rewraps every data key from the
previous key to the current one (in batches; run again, it finishes a rotation cut short), then the previous
key is dropped. A wrong previous key, or a process left with the old key alone, fails typed, writes nothing
and shows no key."""

from __future__ import annotations

import os
import subprocess
import sys
from uuid import UUID, uuid4

import orjson
import psycopg
import pytest

from commitline import ConfigurationError, WrongMasterKey
from commitline.composition import Commitline, bootstrap
from commitline.examples.payments import PaymentTransaction
from commitline.infrastructure.personal.master import MasterKey, generate
from tests.support import MASTER_KEY, count_rows, settings_for

pytestmark = pytest.mark.integration
OLD = MASTER_KEY  # the key every test process starts with


def create(app: Commitline, key: str) -> UUID:
    return app.dispatch({"type": "create_payment", "amount": "12.50", "currency": "EUR",
                         "account": f"ACC-{key}-{uuid4().hex}"}, idempotency_key=key).aggregate_id


def wrapped_by(pg_dsn: str, schema: str) -> dict[str, str]:
    """Each data subject's master key id."""
    with psycopg.connect(pg_dsn) as conn:
        return dict(conn.execute(f'SELECT subject, master_key_id FROM "{schema}".data_keys').fetchall())


def key_rows(pg_dsn: str, schema: str) -> list[tuple[object, ...]]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f'SELECT key_id, wrapped, master_key_id FROM "{schema}".data_keys ORDER BY key_id') \
            .fetchall()


def rotate(pg_dsn: str, schema: str, *, master: str, previous: str | None, stdin: str = "") \
        -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "COMMITLINE_MASTER_KEY": master}
    env.pop("COMMITLINE_PREVIOUS_MASTER_KEY", None)
    if previous is not None:
        env["COMMITLINE_PREVIOUS_MASTER_KEY"] = previous
    return subprocess.run([sys.executable, "-m", "commitline.cli", "keys", "rotate"], capture_output=True,
                          text=True, timeout=120, input=stdin, env=env)


def secrets_in(text: str, *keys: str) -> list[str]:
    return [k for k in keys if k in text]


def test_a_process_with_the_previous_key_reads_old_keys_and_wraps_new_ones_under_the_current_key(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    old_payment = create(app, "before")
    new = generate()
    with bootstrap(settings_for(pg_dsn, schema, master_key=new, previous_master_key=OLD)) as rolled:
        assert rolled.load(PaymentTransaction, old_payment).account.startswith("ACC-before-")
        new_payment = create(rolled, "during")
        assert rolled.load(PaymentTransaction, new_payment).account.startswith("ACC-during-")
    assert wrapped_by(pg_dsn, schema) == {str(old_payment): MasterKey.parse(OLD).key_id,
                                          str(new_payment): MasterKey.parse(new).key_id}
    # A process not yet deployed with both keys still reads what the old key wraps, and is refused the rest.
    assert app.load(PaymentTransaction, old_payment).account.startswith("ACC-before-")
    with pytest.raises(WrongMasterKey) as refused:
        app.load(PaymentTransaction, new_payment)
    assert not secrets_in(str(refused.value), OLD, new)


def test_keys_rotate_with_the_previous_key_configured_rewraps_every_key_to_the_current_one(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    payments = [create(app, f"p{n}") for n in range(5)]
    new = generate()
    with bootstrap(settings_for(pg_dsn, schema, master_key=new, previous_master_key=OLD)) as rolled:
        payments.append(create(rolled, "during"))  # wrapped under the new key already

        class CutShort:  # the new key, failing after two data keys: the rotation stops in its second batch
            def __init__(self, key: MasterKey):
                self.key, self.key_id, self.calls = key, key.key_id, 0

            def wrap(self, *args: str) -> bytes:
                self.calls += 1
                if self.calls > 2:
                    raise OSError("the rotation was cut short")
                return self.key.wrap(*args)  # type: ignore[arg-type]

        master = rolled.codec.personal.master()
        with pytest.raises(OSError):
            rolled.data_keys().rewrap(master.previous, CutShort(master.current), batch=2)  # type: ignore[arg-type]
    assert sorted(wrapped_by(pg_dsn, schema).values()).count(MasterKey.parse(new).key_id) == 3

    assert app.unready() == []  # the old key alone still opens what it wrapped
    done = rotate(pg_dsn, schema, master=new, previous=OLD)
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == {"rewrapped": 3, "already": 3, "master_key_id": MasterKey.parse(new).key_id}
    # A process left with the old key alone opens nothing any more: it says so at its next readiness probe (it
    # once stayed ready, answering every personal command 503 wrong_master_key).
    (reason,) = app.unready()
    assert reason.startswith("personal fields cannot be written or read") and "retired by a rotation" in reason
    assert not secrets_in(reason, OLD, new)
    assert "COMMITLINE_PREVIOUS_MASTER_KEY can be dropped" in done.stderr
    assert not secrets_in(done.stdout + done.stderr, OLD, new)
    assert set(wrapped_by(pg_dsn, schema).values()) == {MasterKey.parse(new).key_id}
    again = rotate(pg_dsn, schema, master=new, previous=OLD)
    assert again.returncode == 0 and orjson.loads(again.stdout)["rewrapped"] == 0  # nothing left to do
    with bootstrap(settings_for(pg_dsn, schema, master_key=new)) as after:  # the previous key dropped
        assert all(after.load(PaymentTransaction, p).account.startswith("ACC-") for p in payments)


def test_a_wrong_previous_key_is_refused_and_writes_nothing(app: Commitline, pg_dsn: str, schema: str) -> None:
    old_payment = create(app, "before")
    new, wrong = generate(), generate()
    with bootstrap(settings_for(pg_dsn, schema, master_key=new, previous_master_key=wrong)) as misconfigured:
        before, keys_before = count_rows(pg_dsn, schema), key_rows(pg_dsn, schema)
        for attempt in (lambda: misconfigured.load(PaymentTransaction, old_payment),
                        lambda: create(misconfigured, "refused")):
            with pytest.raises(WrongMasterKey) as refused:
                attempt()
            text = str(refused.value) + orjson.dumps(refused.value.to_dict()).decode()
            assert not secrets_in(text, OLD, new, wrong) and MasterKey.parse(wrong).key_id in text
        assert count_rows(pg_dsn, schema) == before and key_rows(pg_dsn, schema) == keys_before
    with bootstrap(settings_for(pg_dsn, schema, master_key=new, previous_master_key=OLD)) as rolled:
        create(rolled, "during")  # one key under the new master key: the wrong one now passes the first check
    keys_before = key_rows(pg_dsn, schema)
    refused = rotate(pg_dsn, schema, master=new, previous=wrong)
    assert refused.returncode == 3 and "wrong_master_key" in refused.stderr, refused.stderr
    assert "nothing was rewrapped" in refused.stderr
    assert not secrets_in(refused.stdout + refused.stderr, OLD, new, wrong)
    assert key_rows(pg_dsn, schema) == keys_before


def test_a_process_left_with_the_old_key_alone_after_the_rotation_is_refused(app: Commitline, pg_dsn: str,
                                                                             schema: str) -> None:
    payment = create(app, "before")
    new = generate()
    assert rotate(pg_dsn, schema, master=new, previous=OLD).returncode == 0
    with bootstrap(settings_for(pg_dsn, schema)) as stale:  # COMMITLINE_MASTER_KEY still the old key
        before, keys_before = count_rows(pg_dsn, schema), key_rows(pg_dsn, schema)
        for attempt in (lambda: stale.load(PaymentTransaction, payment), lambda: create(stale, "refused")):
            with pytest.raises(WrongMasterKey) as refused:
                attempt()
            assert not secrets_in(str(refused.value), OLD, new)
        assert count_rows(pg_dsn, schema) == before and key_rows(pg_dsn, schema) == keys_before


def test_a_process_that_kept_running_with_the_old_key_alone_makes_no_data_key_under_it_after_the_rotation(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    """``app`` checked its key before the rotation and keeps it: a new data subject's key wrapped under the
    retired key would be one the processes with the new key cannot open and the next rotation refuses. The
    store refuses it (the command writes nothing), and a process started later with the old key is refused
    too, without giving the retired key back its place."""
    create(app, "before")
    new = generate()
    done = rotate(pg_dsn, schema, master=OLD, previous=None, stdin=new)
    assert done.returncode == 0, done.stderr
    before, keys_before = count_rows(pg_dsn, schema), key_rows(pg_dsn, schema)
    old_id = MasterKey.parse(OLD).key_id
    with pytest.raises(WrongMasterKey) as refused:
        create(app, "after")
    assert f"the master key {old_id} this process wraps new data keys under was retired by a rotation" in \
        str(refused.value)
    assert not secrets_in(str(refused.value), OLD, new)
    with pytest.raises(WrongMasterKey, match="it was retired by a rotation at .*configure the key it was rotated to") \
            as retired:
        with bootstrap(settings_for(pg_dsn, schema)) as restarted:
            create(restarted, "restarted")
    assert "PREVIOUS_MASTER_KEY" not in str(retired.value) and "the old or the new" not in str(retired.value)
    assert count_rows(pg_dsn, schema) == before and key_rows(pg_dsn, schema) == keys_before
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT retired_at IS NOT NULL FROM "{schema}".master_keys WHERE master_key_id = %s',
                            (old_id,)).fetchone() == (True,)
    with bootstrap(settings_for(pg_dsn, schema, master_key=new)) as rolled:  # the new key writes on
        create(rolled, "rolled")
    assert set(wrapped_by(pg_dsn, schema).values()) == {MasterKey.parse(new).key_id}


def test_keys_rotate_given_no_key_and_no_previous_key_names_what_to_configure(app: Commitline, pg_dsn: str,
                                                                               schema: str) -> None:
    create(app, "before")
    keys_before = key_rows(pg_dsn, schema)
    done = rotate(pg_dsn, schema, master=OLD, previous=None)
    assert done.returncode == 3 and "COMMITLINE_PREVIOUS_MASTER_KEY" in done.stderr, done.stderr
    assert key_rows(pg_dsn, schema) == keys_before
    with pytest.raises(ConfigurationError) as refused:
        app.rotate_master_key()
    assert refused.value.variable == "COMMITLINE_PREVIOUS_MASTER_KEY"
