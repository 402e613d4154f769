"""The versioned schema: starts read the version instead of running DDL; migrations upgrade in place."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from uuid import UUID, uuid4

import orjson

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresDatastore

from commitline.application.chain import GENESIS, chain
from commitline.application.errors import ConfigurationError, StoreUnavailable
from commitline.application.results import DispatchResult
from commitline.composition import Commitline, bootstrap
from commitline.infrastructure import migrations
from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.store import hash_backfill
from commitline.infrastructure.store.recorder import EventRecorder
from tests.integration.test_cli import commitline
from tests.support import count_rows, settings_for


def version(pg_dsn: str, schema: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        return migrations.schema_version(conn, schema)


def test_a_fresh_schema_is_migrated_at_start_and_check_says_so(app: Commitline, pg_dsn: str, schema: str) -> None:
    assert version(pg_dsn, schema) == migrations.LATEST
    check = commitline(["migrate", "--check", "--json"], pg_dsn, schema)
    assert check.returncode == 0, check.stderr
    assert orjson.loads(check.stdout)["pending"] == []
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert migrations.migrate(conn, schema) == []


def create_previous_schema(pg_dsn: str, schema: str) -> None:
    """What commitline did at every start before migrations existed: IF NOT EXISTS DDL, no version table."""
    settings = settings_for(pg_dsn, schema)
    parts = settings.connection_parts()
    datastore = PostgresDatastore(parts["dbname"], parts["host"], parts["port"], parts["user"], parts["password"],
                                  schema=schema)
    try:
        EventRecorder(datastore).create_table()
        with datastore.get_connection() as conn:
            for statement in Positions(schema).create_statements():
                conn.execute(statement)
    finally:
        datastore.close()


def test_a_store_from_before_migrations_is_upgraded_in_place_losing_nothing(pg_dsn: str, schema: str) -> None:
    create_previous_schema(pg_dsn, schema)
    assert version(pg_dsn, schema) == 0
    # Written as a commitline from before group commit did: one transaction per command.
    with bootstrap(settings_for(pg_dsn, schema, group_commit_max=0), apply_migrations=False) as old:
        old.store.codec.personal = None  # nor had it personal data keys: it wrote every field as it was
        created = old.dispatch({"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "a"},
                               idempotency_key="before-upgrade")
        old.dispatch({"type": "submit_payment", "payment_id": str(created.aggregate_id)}, idempotency_key="submit")
    before = count_rows(pg_dsn, schema)
    check = commitline(["migrate", "--check"], pg_dsn, schema)
    assert check.returncode == 1 and "pending" in check.stdout, check.stdout + check.stderr
    upgraded = commitline(["migrate"], pg_dsn, schema)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "applied migration 1" in upgraded.stdout
    assert version(pg_dsn, schema) == migrations.LATEST
    assert count_rows(pg_dsn, schema) == before
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        assert app.auditor().verify().ok
        replay = app.dispatch({"type": "submit_payment", "payment_id": str(created.aggregate_id)},
                              idempotency_key="submit")
        assert replay.replayed and replay.version == 2


def test_commands_on_a_schema_that_lacks_the_append_function_say_to_migrate(pg_dsn: str, schema: str) -> None:
    create_previous_schema(pg_dsn, schema)
    with bootstrap(settings_for(pg_dsn, schema), apply_migrations=False) as app:
        with pytest.raises(StoreUnavailable, match="lacks migration 6; run commitline migrate"):
            app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1},
                         idempotency_key="too-early")
    assert count_rows(pg_dsn, schema)["events"] == 0


def test_a_store_migrated_by_a_newer_commitline_is_refused(app: Commitline, pg_dsn: str, schema: str) -> None:
    """Refused to a process that starts; one already running (a rolling upgrade's older processes, while the new
    release's migrate job has run) stays ready and goes on: migration steps only add."""
    assert app.unready() == []
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{schema}".schema_migrations (version, description) VALUES (999, %s)',
                     ("from the future",))
    assert app.unready() == []
    assert app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1},
                        idempotency_key="still-serving").version == 1
    with pytest.raises(ConfigurationError, match="version 999, newer than this commitline knows") as refused:
        bootstrap(settings_for(pg_dsn, schema))
    assert not isinstance(refused.value, StoreUnavailable)  # the database answered: retrying changes nothing
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    for args in (["migrate", "--check"], ["migrate"], ["status", "--check"]):
        done = subprocess.run([sys.executable, "-m", "commitline.cli", *args], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 3 and "Traceback" not in done.stderr, (args, done.stderr)
        assert orjson.loads(done.stderr)["code"] == "configuration_error", (args, done.stderr)


STARTER = """
import sys, time
from pathlib import Path
from commitline.composition import bootstrap
from tests.support import settings_for
dsn, schema, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
bootstrap(settings_for(dsn, schema, pool_size=1)).close()
"""


@pytest.mark.parametrize("round_", range(5))
def test_twenty_processes_starting_at_once_on_an_empty_schema_all_succeed(pg_dsn: str, round_: int,
                                                                          tmp_path: Path) -> None:
    schema = f"t_first_{uuid4().hex[:10]}"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", STARTER, pg_dsn, schema, str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]) for _ in range(20)]
    try:
        for p in procs:  # every process has imported everything and waits at the line
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        go.touch()
        results = [(p.wait(timeout=180), p.stderr.read() if p.stderr else "") for p in procs]
        assert [code for code, _ in results] == [0] * 20, [err for code, err in results if code][:1]
        assert version(pg_dsn, schema) == migrations.LATEST
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_new_process_never_waits_on_an_open_append(app: Commitline, pg_dsn: str, schema: str) -> None:
    inserted, release = threading.Event(), threading.Event()
    app.recorder.before_commit = lambda: (inserted.set(), release.wait(120))
    held = threading.Thread(target=app.dispatch, args=({"type": "receive_stock", "item_id": str(uuid4()),
                                                        "quantity": 1},), kwargs={"idempotency_key": "held"})
    held.start()
    try:
        assert inserted.wait(30), "the held append never reached its commit"
        status = commitline(["status", "--json"], pg_dsn, schema)
        dispatched = commitline(["dispatch", "-k", "beside", '{"type": "receive_stock", "item_id": "%s", '
                                 '"quantity": 2}' % uuid4()], pg_dsn, schema)
        assert held.is_alive(), "the append must still be open while the other process worked"
        assert status.returncode == 0, status.stderr
        assert dispatched.returncode == 0, dispatched.stderr
    finally:
        release.set()
        held.join(30)
        app.recorder.before_commit = None
    assert count_rows(pg_dsn, schema)["events"] == 2


# -- a store from before the audit's hash chains ---------------------------------------------------------
# The DDL and inserts of commitline before the audit (commit 6f7b4cf, infrastructure/recorder.py): events
# without prev_hash/event_hash, idempotency records without stream_version, snapshots without event_hash.
PRE_AUDIT_DDL = [
    'CREATE TABLE IF NOT EXISTS {s}.events ('
    ' notification_id bigint GENERATED ALWAYS AS IDENTITY (CACHE 1),'
    ' originator_id uuid NOT NULL,'
    ' originator_version bigint NOT NULL CHECK (originator_version > 0),'
    ' topic text NOT NULL,'
    ' state bytea NOT NULL,'
    ' txid xid8 NOT NULL DEFAULT pg_current_xact_id(),'
    ' PRIMARY KEY (originator_id, originator_version))',
    'CREATE UNIQUE INDEX IF NOT EXISTS events_notification_id_idx ON {s}.events (notification_id)',
    "CREATE OR REPLACE FUNCTION {s}.reject_event_change() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "RAISE EXCEPTION 'events are append-only: % on %.% rejected', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME "
    "USING ERRCODE = 'restrict_violation'; END $$",
    'CREATE OR REPLACE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON {s}.events '
    'FOR EACH ROW EXECUTE FUNCTION {s}.reject_event_change()',
    'CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON {s}.events '
    'FOR EACH STATEMENT EXECUTE FUNCTION {s}.reject_event_change()',
    'CREATE TABLE IF NOT EXISTS {s}.idempotency_keys ('
    ' tenant text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL, command_type text NOT NULL,'
    ' aggregate_id uuid NOT NULL, outcome bytea NOT NULL, recorded_at timestamptz NOT NULL DEFAULT now(),'
    ' PRIMARY KEY (tenant, key))',
    'CREATE TABLE IF NOT EXISTS {s}.snapshots ('
    ' aggregate_id uuid NOT NULL, version bigint NOT NULL, aggregate_type text NOT NULL, state bytea NOT NULL,'
    ' taken_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (aggregate_id, version))',
]
PRE_AUDIT_INSERT_EVENTS = ("INSERT INTO {s}.events (originator_id, originator_version, topic, state) "
                           "SELECT * FROM unnest(%s::uuid[], %s::int8[], %s::text[], %s::bytea[]) "
                           "RETURNING notification_id")
EVENT_ROWS = "SELECT notification_id, originator_id, originator_version, topic, state FROM {s}.events ORDER BY 1"


def workload(app: Commitline, outcomes: dict[str, bytes] | None = None) -> dict[str, UUID]:
    """Commands over several streams of several versions, with idempotency keys and snapshots; ``outcomes`` gets
    each key's answer as the records of a store from before migration 14 held it."""
    def dispatch(command: dict[str, object], key: str) -> DispatchResult:
        result = app.dispatch(command, idempotency_key=key)
        if outcomes is not None:
            outcomes[key] = result.outcome_bytes()
        return result

    payments = []
    for i in range(3):
        created = dispatch({"type": "create_payment", "amount": f"{i + 1}.50", "currency": "EUR",
                            "account": f"acct-{i}"}, f"create-{i}")
        payments.append(created.aggregate_id)
        dispatch({"type": "submit_payment", "payment_id": str(created.aggregate_id)}, f"submit-{i}")
    dispatch({"type": "complete_payment", "payment_id": str(payments[0])}, "complete-0")
    item = uuid4()
    for n in range(5):
        dispatch({"type": "receive_stock", "item_id": str(item), "quantity": n + 1}, f"stock-{n}")
    return {"payment": payments[0], "item": item}


def create_pre_audit_store(pg_dsn: str, schema: str) -> dict[str, UUID]:
    """The test's schema as commitline left it before the audit: the old DDL, and the events, idempotency
    records and snapshots of a workload inserted the way that version inserted them."""
    source = f"{schema}_src"
    try:
        with bootstrap(settings_for(pg_dsn, source, snapshot_interval=2)) as app:
            outcomes: dict[str, bytes] = {}
            ids = workload(app, outcomes)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            events = conn.execute(EVENT_ROWS.format(s=source)).fetchall()
            keys = [(*row, outcomes[row[1]]) for row in conn.execute(
                f"SELECT tenant, key, fingerprint, command_type, aggregate_id FROM {source}.idempotency_keys")]
            snapshots = conn.execute(f"SELECT aggregate_id, version, aggregate_type, state FROM {source}.snapshots"
                                     ).fetchall()
            assert snapshots, "the workload must leave snapshots to upgrade"
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            for statement in PRE_AUDIT_DDL:
                conn.execute(statement.format(s=schema))
            for _, originator_id, version, topic, state in events:  # one append per event, as commands did
                conn.execute(PRE_AUDIT_INSERT_EVENTS.format(s=schema), ([originator_id], [version], [topic], [state]))
            conn.cursor().executemany(f"INSERT INTO {schema}.idempotency_keys (tenant, key, fingerprint, "
                                      "command_type, aggregate_id, outcome) VALUES (%s, %s, %s, %s, %s, %s)", keys)
            conn.cursor().executemany(f"INSERT INTO {schema}.snapshots (aggregate_id, version, aggregate_type, "
                                      "state) VALUES (%s, %s, %s, %s)", snapshots)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {source} CASCADE")
    return ids


def event_rows(pg_dsn: str, schema: str) -> list[tuple]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(EVENT_ROWS.format(s=schema)).fetchall()


def expected_links(rows: list[tuple]) -> dict[tuple[UUID, int], tuple[bytes, bytes]]:
    """Every event's (prev_hash, event_hash), derived independently from the rows, stream by stream."""
    links = {}
    for stream in {r[1] for r in rows}:
        ordered = sorted((r for r in rows if r[1] == stream), key=lambda r: r[2])
        records = [StoredEvent(r[1], r[2], r[3], bytes(r[4])) for r in ordered]
        for r, link in zip(ordered, chain(GENESIS, records)):
            links[(r[1], r[2])] = link
    return links


def stored_links(pg_dsn: str, schema: str) -> dict[tuple[UUID, int], tuple[bytes, bytes]]:
    with psycopg.connect(pg_dsn) as conn:
        return {(i, v): (bytes(p), bytes(h)) for i, v, p, h in conn.execute(
            f"SELECT originator_id, originator_version, prev_hash, event_hash FROM {schema}.events "
            "WHERE event_hash IS NOT NULL").fetchall()}


def assert_upgraded(pg_dsn: str, schema: str, before: list[tuple]) -> None:
    assert version(pg_dsn, schema) == migrations.LATEST
    assert event_rows(pg_dsn, schema) == before, "an event was lost or changed"
    assert stored_links(pg_dsn, schema) == expected_links(before)
    with psycopg.connect(pg_dsn) as conn:
        nullable = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND column_name IN ('prev_hash', 'event_hash', 'stream_version') AND is_nullable = 'YES'",
            (schema,)).fetchall()
        assert nullable == [], nullable
    verified = commitline(["audit", "verify", "--all"], pg_dsn, schema)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_store_from_before_the_hash_chains_is_upgraded_in_place_after_a_crash_mid_backfill(
        pg_dsn: str, schema: str) -> None:
    ids = create_pre_audit_store(pg_dsn, schema)
    before = event_rows(pg_dsn, schema)
    assert len({r[1] for r in before}) == 4 and len(before) == 12
    # A first run that crashed after two batches of three: hashes committed for the first six events only.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        hash_backfill.add_columns(conn, schema)
        after = hash_backfill.hash_batch(conn, schema, None, 3)
        hash_backfill.hash_batch(conn, schema, after, 3)
    partial = stored_links(pg_dsn, schema)
    assert len(partial) == 6 and partial.items() <= expected_links(before).items()

    upgraded = commitline(["migrate"], pg_dsn, schema)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "applied migration 3" in upgraded.stdout
    assert_upgraded(pg_dsn, schema, before)

    with bootstrap(settings_for(pg_dsn, schema)) as app:  # new appends continue the chains
        head = app.recorder.event_hash(ids["payment"], 3)
        app.dispatch({"type": "receive_stock", "item_id": str(ids["item"]), "quantity": 9}, idempotency_key="after")
        replay = app.dispatch({"type": "submit_payment", "payment_id": str(ids["payment"])},
                              idempotency_key="submit-0")
        assert replay.replayed and replay.version == 2  # the old idempotency records still answer
        assert head == stored_links(pg_dsn, schema)[(ids["payment"], 3)][1]
        new = stored_links(pg_dsn, schema)[(ids["item"], 6)]
        assert new[0] == stored_links(pg_dsn, schema)[(ids["item"], 5)][1]
        assert app.auditor().verify().ok
    assert event_rows(pg_dsn, schema)[: len(before)] == before


def test_starting_commitline_on_a_store_from_before_the_hash_chains_upgrades_it(pg_dsn: str, schema: str) -> None:
    create_pre_audit_store(pg_dsn, schema)
    before = event_rows(pg_dsn, schema)
    with psycopg.connect(pg_dsn) as conn:
        witnessed = conn.execute(f"SELECT tenant, key, aggregate_id, convert_from(outcome, 'UTF8')::jsonb->>'version'"
                                 f" FROM {schema}.idempotency_keys ORDER BY 1, 2").fetchall()
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        assert app.auditor().verify().ok
    assert_upgraded(pg_dsn, schema, before)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT tenant, key, aggregate_id, stream_version::text FROM {schema}.idempotency_keys "
                            "ORDER BY 1, 2").fetchall() == witnessed
        hashed = conn.execute(f"SELECT count(*) FROM {schema}.snapshots s JOIN {schema}.events e ON "
                              "e.originator_id = s.aggregate_id AND e.originator_version = s.version "
                              "WHERE s.event_hash = e.event_hash").fetchone()[0]
        assert hashed == count_rows(pg_dsn, schema)["snapshots"] > 0
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):  # the trigger is back in force
            conn.execute(f"UPDATE {schema}.events SET topic = 'x' WHERE originator_version = 1")
        hash_backfill.upgrade(conn, schema, batch_rows=2)  # running it again changes nothing
    assert event_rows(pg_dsn, schema) == before


def test_migrations_another_process_applied_meanwhile_are_not_reported_as_pending_here(
        pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes migrating at once: the one that finds every step applied when it gets the lock says the
    schema was at that version, not that it was at 0 and applied nothing."""
    with bootstrap(settings_for(pg_dsn, schema), apply_migrations=False) as app:
        assert version(pg_dsn, schema) < migrations.LATEST
        real = migrations.migrate

        def beaten(conn: psycopg.Connection, name: str) -> list[migrations.Migration]:
            with psycopg.connect(pg_dsn, autocommit=True) as other:  # the other process, first to the lock
                real(other, name)
            return real(conn, name)

        monkeypatch.setattr(migrations, "migrate", beaten)
        done = app.migrate()
    assert (done.was, done.version, done.applied, done.pending) == (migrations.LATEST, migrations.LATEST, [], [])
