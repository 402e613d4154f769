"""Point eventsourcing's own unittest cases at the suite's PostgreSQL: each test gets the library's
environment variables (``PERSISTENCE_MODULE=commitline.eventsourcing``, ``POSTGRES_*``) naming the
session database (``pg_dsn``) and a fresh schema, dropped afterwards with everything in it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from tests.eventsourcing_suite import library_environment


@pytest.fixture(autouse=True)
def library_env(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    schema = f"es_{uuid.uuid4().hex[:12]}"
    env = library_environment(pg_dsn, schema)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield env
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(Identifier(schema)))
