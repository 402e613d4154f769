"""Shared plumbing of the benchmarks (measures nothing itself; it has no baseline).

- :func:`open_database`: ``COMMITLINE_BENCH_DSN`` if set, else an :class:`EmbeddedPostgres`
  in a temporary folder (fsync, synchronous_commit and full_page_writes on: the honest default).
- :func:`fresh_schema`: a schema ``bench_<random>`` dropped (CASCADE) at the end.
- :func:`commitline_app`: ``bootstrap(Settings(...))`` on that schema with the bench pool sizes (the built-in
  examples, or the domain given).
- :func:`run_together`: n threads released at once by a ``threading.Barrier``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from commitline import Domain
from commitline.composition import Commitline, bootstrap
from commitline.infrastructure.config import Settings
from commitline.infrastructure.personal.master import generate as generate_master_key

T = TypeVar("T")

DSN_VARIABLE = "COMMITLINE_BENCH_DSN"

#: Pool used by every app under test (ours and the baseline): 8 kept + 40 overflow = 48
#: connections, so 32 concurrent writers never wait on the pool.
POOL_SIZE = 8
POOL_MAX_OVERFLOW = 40


@dataclass(frozen=True)
class BenchContext:
    """What every benchmark callable receives."""

    dsn: str
    quick: bool

    def parts(self) -> dict[str, Any]:
        """host, port, dbname, user, password of the bench database."""
        return Settings(database_url=self.dsn).connection_parts()


@contextlib.contextmanager
def open_database() -> Iterator[tuple[str, str]]:
    """Yield (dsn, one-line description without secrets) of the database to benchmark against."""
    configured = os.environ.get(DSN_VARIABLE, "").strip()
    if configured:
        yield configured, f"{DSN_VARIABLE} ({_server_facts(configured)})"
        return
    from commitline.infrastructure.embedded.postgres import EmbeddedPostgres

    folder = Path(tempfile.mkdtemp(prefix="commitline-bench-"))
    server = EmbeddedPostgres(folder / "data", database="commitline_bench")
    try:
        server.start()
        yield server.dsn, f"embedded PostgreSQL in {folder} ({_server_facts(server.dsn)})"
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _server_facts(dsn: str) -> str:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        values = {
            name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit", "max_connections")
        }
    version = str(values["server_version"]).split()[0]
    return (f"PostgreSQL {version}, fsync={values['fsync']}, synchronous_commit={values['synchronous_commit']}, "
            f"max_connections={values['max_connections']}, {os.cpu_count()} CPUs")


@contextlib.contextmanager
def fresh_schema(dsn: str, prefix: str = "bench") -> Iterator[str]:
    """Create a schema ``<prefix>_<random>``; drop it with everything in it at the end."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


#: The master key of the examples' personal fields (payments' accounts), also for the processes a bench starts
MASTER_KEY = os.environ.setdefault("COMMITLINE_MASTER_KEY", generate_master_key())


def commitline_app(dsn: str, schema: str, *, domain: Domain | None = None, **overrides: Any) -> Commitline:
    """commitline on ``schema`` with the bench pool sizes: the built-in examples, or ``domain``."""
    values: dict[str, Any] = {
        "database_url": dsn, "schema_name": schema, "master_key": MASTER_KEY,
        "pool_size": POOL_SIZE, "pool_max_overflow": POOL_MAX_OVERFLOW,
    }
    values.update(overrides)
    return bootstrap(Settings(**values), domain=domain)


def run_together(
    n: int, work: Callable[[int], T], *, action: Callable[[], None] | None = None, timeout: float = 120.0
) -> list[T | BaseException]:
    """Run ``work(i)`` for i in range(n) in n threads released together; results or exceptions.

    ``action`` runs once, in one thread, when all n have arrived and before any is released.
    """
    barrier = threading.Barrier(n, action=action)
    outcomes: list[Any] = [None] * n

    def body(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = work(i)
        except BaseException as e:  # counted by the caller
            outcomes[i] = e

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if any(t.is_alive() for t in threads):
        raise RuntimeError(f"{sum(t.is_alive() for t in threads)} of {n} bench threads still running after {timeout} s")
    return outcomes
