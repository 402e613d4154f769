"""Proof of forgetting, by reading the database's files: after a subject is erased (and the read model that
copied its email recomputed), a checkpoint and a VACUUM, no file of the PostgreSQL data directory outside
``pg_wal`` holds a byte of the erased email. A subject that is kept proves the scan can see: its email is in
the read model's table file, where it legitimately lives, and nowhere in the events table's files (it is
sealed there). What ``pg_wal`` still holds of the erased email is reported, not asserted: the WAL keeps it
until checkpoints recycle its segments (docs/guides/personal-data.md).

The test runs its own embedded PostgreSQL, so its data directory holds this test's writes only, and stops it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import psycopg
import pytest

from commitline.composition import Commitline, bootstrap
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from tests.domains import customers
from tests.support import FollowerThread, count_rows, settings_for

pytestmark = pytest.mark.integration
SCHEMA = "forgetting"
CONTACTS = "rm_customer_contacts"
BY_EMAIL = "rm_customers_by_email"  # the read model's second table, keyed by the email itself


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(tmp_path / "pg" / "data", database="forgetting")
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


def scan(data_dir: Path, needles: dict[str, bytes]) -> dict[str, list[str]]:
    """Per needle, the files of ``data_dir`` outside ``pg_wal`` holding its bytes (paths relative to it)."""
    found: dict[str, list[str]] = {name: [] for name in needles}
    for path in sorted(data_dir.rglob("*")):
        relative = path.relative_to(data_dir)
        if relative.parts[0] == "pg_wal" or not path.is_file():
            continue
        try:
            content = path.read_bytes()
        except FileNotFoundError:  # removed by the running server meanwhile
            continue
        for name, value in needles.items():
            if value in content:
                found[name].append(str(relative))
    return found


def wal_occurrences(data_dir: Path, value: bytes) -> int:
    count = 0
    for path in (data_dir / "pg_wal").rglob("*"):
        if path.is_file():
            try:
                count += path.read_bytes().count(value)
            except FileNotFoundError:  # a segment recycled meanwhile
                continue
    return count


def relation_files(conn: psycopg.Connection, relation: str) -> set[str]:
    """The files of ``relation`` and of its TOAST table and indexes, every fork and segment (relative paths)."""
    oids = [r[0] for r in conn.execute(
        "SELECT c.oid FROM pg_class c WHERE c.oid = %s::regclass "
        "UNION SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass AND reltoastrelid <> 0 "
        "UNION SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass", (relation,) * 3).fetchall()]
    paths = [conn.execute("SELECT pg_relation_filepath(%s)", (oid,)).fetchone()[0] for oid in oids]
    return {p for p in paths if p}


def in_files(found: list[str], files: set[str]) -> list[str]:
    """Those of ``found`` that are a fork or segment of one of ``files`` (``16384``, ``16384_fsm``, ``16384.1``)."""
    return [f for f in found if any(f == p or f.startswith((p + "_", p + ".")) for p in files)]


def test_an_erased_email_is_in_no_file_of_the_database_but_the_write_ahead_log(server: EmbeddedPostgres) -> None:
    erased_email = f"erase-me-{uuid4().hex}@forgotten.test"
    kept_email = f"keep-me-{uuid4().hex}@kept.test"
    other_tenant_email = f"other-tenant-{uuid4().hex}@kept.test"
    # the erased subject comes last: its rows lie lowest in their pages, where no compaction overwrites them
    people = (("acme", "c-2", kept_email), ("globex", "c-1", other_tenant_email), ("acme", "c-1", erased_email))
    needles = {"erased": erased_email.encode(), "kept": kept_email.encode(), "other": other_tenant_email.encode()}

    with bootstrap(settings_for(server.dsn, SCHEMA, snapshot_interval=2), domain=customers.domain) as app:
        write_through_commands(app, people)
        assert count_rows(server.dsn, SCHEMA) == {"events": 6, "idempotency_keys": 6, "snapshots": 3}
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            emails = dict(conn.execute(f"SELECT customer_id || '@' || tenant, email FROM {SCHEMA}.{CONTACTS}"))
            assert emails == {"c-1@acme": erased_email, "c-2@acme": kept_email, "c-1@globex": other_tenant_email}
            conn.execute(f"ANALYZE {SCHEMA}.{CONTACTS}")  # pg_statistic now holds the emails too, as on a real store
            rows = conn.execute(f"SELECT tenant, subject, wrapped FROM {SCHEMA}.data_keys").fetchall()
        keys = {(tenant, subject): bytes(wrapped) for tenant, subject, wrapped in rows}
        needles |= {"erased key": keys["acme", "c-1"], "kept key": keys["acme", "c-2"]}
        with FollowerThread(lambda: app.projector("customer_contacts", poll_interval=0.2)):
            report = app.erase("acme", "c-1")  # rebuilds customer_contacts: the live projector yields to the swap
        assert [r.projection for r in report.rebuilt] == ["customer_contacts"]

    with psycopg.connect(server.dsn, autocommit=True) as conn:
        emails = dict(conn.execute(f"SELECT customer_id || '@' || tenant, email FROM {SCHEMA}.{CONTACTS}"))
        assert emails == {"c-1@acme": '{"erased": true}', "c-2@acme": kept_email, "c-1@globex": other_tenant_email}
        conn.execute("CHECKPOINT")  # the dropped table's files are unlinked, every page is in its file
        conn.execute("VACUUM")
        conn.execute("CHECKPOINT")
        # A plain VACUUM frees the dead rows but leaves their bytes in the pages' free space: the deleted data key
        # (its wrapped bytes) and the statistics ANALYZE took of the dropped read-model table are still there.
        left = scan(server.data_dir, {"email": needles["erased"], "key": needles["erased key"]})
        print(f"after CHECKPOINT, VACUUM, CHECKPOINT: the erased email in {left['email']}, its key in {left['key']}")
        conn.execute(f"VACUUM FULL {SCHEMA}.data_keys, pg_catalog.pg_statistic")  # rewritten: no dead row's byte
        conn.execute("CHECKPOINT")  # the files they were rewritten from are unlinked
        events = relation_files(conn, f"{SCHEMA}.events")
        contacts = relation_files(conn, f"{SCHEMA}.{CONTACTS}") | relation_files(conn, f"{SCHEMA}.{BY_EMAIL}")

    found = scan(server.data_dir, needles)
    assert found["erased"] == [] and found["erased key"] == []
    assert found["kept key"]  # the scan sees the data keys' file
    assert in_files(found["kept"], contacts) and in_files(found["other"], contacts)  # the scan sees rows
    assert in_files(found["kept"], events) == [] and in_files(found["other"], events) == []  # sealed there
    assert sorted(found["kept"]) == sorted(in_files(found["kept"], contacts)), found["kept"]

    in_wal = {name: wal_occurrences(server.data_dir, needles[name]) for name in ("erased", "erased key")}
    print(f"pg_wal still holds the erased email {in_wal['erased']} times and its data key {in_wal['erased key']} "
          "times (until checkpoints recycle its segments)")
    assert all(isinstance(n, int) and n >= 0 for n in in_wal.values())


def write_through_commands(app: Commitline, people: tuple[tuple[str, str, str], ...]) -> None:
    """Register and close each customer (events, outcomes, a snapshot at version 2), with the live projector
    copying each email and then updating its row (the first row version stays behind as a dead tuple)."""
    with FollowerThread(lambda: app.projector("customer_contacts", poll_interval=0.2)) as projector:
        ids = [app.dispatch({"type": "register_customer", "customer_id": cid, "email": email},
                            idempotency_key=f"register-{cid}", tenant=tenant).aggregate_id
               for tenant, cid, email in people]
        projector.wait_until_at(app.recorder.max_notification_id())
        for (tenant, cid, _), customer in zip(people, ids):
            app.dispatch({"type": "close_customer", "customer": str(customer)}, idempotency_key=f"close-{cid}",
                         tenant=tenant)
        projector.wait_until_at(app.recorder.max_notification_id())
