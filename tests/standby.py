"""A primary and its streaming standby for the failover tests, both embedded PostgreSQL servers.

:func:`primary_and_standby` starts a primary (``wal_level=replica``), makes a hot standby of it with
``pg_basebackup -R`` on its own port, waits until it streams, and (``synchronous=True``) makes every commit
wait for it; on the way out the primary is killed (never restarted after a failover: it would be a second
primary) and the standby stopped. :func:`promote` is ``pg_ctl promote`` plus the runbook's clearing of
``synchronous_standby_names``; :func:`fleet_url` is the one libpq URL every process is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.embedded.postgres_binaries import PostgresBinaries
from tests.support import wait_for

DATABASE = "commitline"


def sql(pg: EmbeddedPostgres, statement: str, database: str = "postgres") -> list[tuple]:
    """``statement``'s rows, in a session that may write whatever the server's default (``set_read_only``)."""
    with psycopg.connect(pg.dsn_for(database), autocommit=True, options="-c default_transaction_read_only=off") as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def run(data_dir: Path, *argv: str, timeout: float = 120) -> None:
    """A binary of the embedded PostgreSQL, run as the server's user (``postgres_binaries``)."""
    rc, out = PostgresBinaries(data_dir).run(list(argv), timeout)
    assert rc == 0, f"{argv[0]} failed ({rc}):\n{out}"


def make_standby(primary: EmbeddedPostgres, data_dir: Path) -> EmbeddedPostgres:
    """A hot standby of ``primary`` in ``data_dir`` (``pg_basebackup -R``), started on its own port, streaming."""
    binaries = PostgresBinaries(data_dir)
    binaries.prepare_data_dir()  # an empty folder the server's user owns
    data_dir.chmod(0o700)  # pg_basebackup keeps the folder's mode, and the server refuses a readable one
    run(data_dir, "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "-D",
        str(data_dir), "-R", "-X", "stream", "-c", "fast")
    standby = EmbeddedPostgres(data_dir, database=DATABASE)
    standby.start()
    wait_for(lambda: sql(primary, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")[0][0] == 1,
             "the standby to stream", timeout=120)
    return standby


def make_synchronous(primary: EmbeddedPostgres) -> None:
    """Every commit on ``primary`` waits for the standby (set only once it streams: before, commits block)."""
    sql(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
    sql(primary, "SELECT pg_reload_conf()")
    wait_for(lambda: sql(primary, "SELECT sync_state FROM pg_stat_replication") == [("sync",)],
             "the standby to be synchronous", timeout=60)


def promote(standby: EmbeddedPostgres) -> None:
    """``pg_ctl promote``, then clear the ``synchronous_standby_names`` a promoted server may keep (the runbook)."""
    run(standby.data_dir, "pg_ctl", "-D", str(standby.data_dir), "-w", "-t", "60", "promote")
    sql(standby, "ALTER SYSTEM RESET synchronous_standby_names")
    sql(standby, "SELECT pg_reload_conf()")
    assert sql(standby, "SELECT pg_is_in_recovery()") == [(False,)]


@contextmanager
def primary_and_standby(folder: Path, *, synchronous: bool) -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    primary = EmbeddedPostgres(folder / "primary", database=DATABASE,
                               settings={"wal_level": "replica", "max_wal_senders": "5", "synchronous_commit": "on"})
    primary.start()
    standby = None
    try:
        standby = make_standby(primary, folder / "standby")
        if synchronous:
            make_synchronous(primary)
        else:
            assert sql(primary, "SELECT sync_state FROM pg_stat_replication") == [("async",)]
        yield primary, standby
    finally:
        primary.kill()
        if standby is not None:
            standby.stop()


def fleet_url(primary: EmbeddedPostgres, standby: EmbeddedPostgres) -> str:
    """Both servers in one URL: every process reconnects to whichever is the primary."""
    return (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{DATABASE}"
            "?target_session_attrs=read-write")
