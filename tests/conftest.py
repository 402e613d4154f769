"""Shared fixtures: a real PostgreSQL for the whole run (embedded unless COMMITLINE_TEST_DSN is set)
and a fresh, isolated schema per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from commitline.composition import Commitline, bootstrap
from tests.support import settings_for


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("COMMITLINE_TEST_DSN")
    if configured:
        try:
            psycopg.connect(configured, connect_timeout=5).close()
        except psycopg.Error as e:
            pytest.fail(f"COMMITLINE_TEST_DSN is set but PostgreSQL cannot be reached: {type(e).__name__}", False)
        yield configured
        return
    from commitline.infrastructure.embedded.postgres import EmbeddedPostgres

    server = EmbeddedPostgres(Path(tmp_path_factory.mktemp("pg")) / "data", database="commitline_test")
    try:
        server.start()
    except Exception as e:  # the run cannot test anything without it: fail loudly, never skip
        pytest.fail(f"embedded PostgreSQL could not start: {e}", False)
    yield server.dsn
    server.stop()


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def app(pg_dsn: str, schema: str) -> Iterator[Commitline]:
    with bootstrap(settings_for(pg_dsn, schema)) as commitline:
        yield commitline


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real Kafka-protocol broker over TCP: KAFKA_BOOTSTRAP_SERVERS, else an embedded Tansu."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        yield configured
        return
    from commitline.infrastructure.embedded.kafka import EmbeddedKafka

    broker = EmbeddedKafka()
    try:
        broker.start()
    except Exception as e:
        pytest.fail(f"embedded Kafka-protocol broker (Tansu) could not start: {e}", False)
    yield broker.bootstrap_servers
    broker.stop()
