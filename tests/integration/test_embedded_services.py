"""Integration tests for the embedded PostgreSQL and Tansu (Kafka-protocol) servers.

Real servers, no mocks: each test starts its own server in pytest's tmp folder
on a free port and stops it afterwards. aiokafka calls run in ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.kafka import EmbeddedKafka
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.embedded.loopback import free_port, listens

pytestmark = pytest.mark.integration


# --------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path / "pgdata")
    try:
        yield server
    finally:
        server.stop()


def test_postgres_starts_on_tcp_and_keeps_data_across_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "pgdata"
    first = EmbeddedPostgres(data_dir)
    try:
        started = time.perf_counter()
        first.start()
        print(f"postgres first start (initdb included): {time.perf_counter() - started:.2f} s")
        first.start()  # idempotent
        assert first.dsn == f"postgresql://postgres@127.0.0.1:{first.port}/commitline"
        assert (data_dir / "PG_VERSION").exists()

        with psycopg.connect(first.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.execute("SELECT current_database(), current_user").fetchone() == (
                "commitline",
                "postgres",
            )
            settings: dict[str, str] = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN "
                    "('fsync', 'synchronous_commit', 'max_connections', 'listen_addresses')"
                ).fetchall()
            )
            assert settings == {
                "fsync": "on",
                "synchronous_commit": "on",
                "max_connections": "200",
                "listen_addresses": "127.0.0.1",
            }
            # a working set of a few hundred thousand events stays in the server's own cache
            assert conn.execute("SHOW shared_buffers").fetchone() == ("256MB",)
            conn.execute("CREATE TABLE kept (id int PRIMARY KEY, note text)")
            conn.execute("INSERT INTO kept VALUES (1, 'survives a restart'), (2, 'me too')")
    finally:
        started = time.perf_counter()
        first.stop()
        print(f"postgres stop: {time.perf_counter() - started:.2f} s")
    first.stop()  # safe twice
    assert not listens(first.port, timeout=0.5)

    second = EmbeddedPostgres(data_dir)  # same folder, new object (and port)
    try:
        started = time.perf_counter()
        second.start()
        print(f"postgres restart on an existing cluster: {time.perf_counter() - started:.2f} s")
        with psycopg.connect(second.dsn) as conn:
            rows = conn.execute("SELECT id, note FROM kept ORDER BY id").fetchall()
        assert rows == [(1, "survives a restart"), (2, "me too")]
    finally:
        second.stop()


def test_postgres_context_manager_and_named_database(tmp_path: Path) -> None:
    port = free_port()
    with EmbeddedPostgres(tmp_path / "other", port=port, database="other_db") as server:
        assert server.dsn == f"postgresql://postgres@127.0.0.1:{port}/other_db"
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("other_db",)
    assert not listens(port, timeout=0.5)


def test_postgres_holds_sixty_concurrent_connections(pg: EmbeddedPostgres) -> None:
    pg.start()
    connections = [psycopg.connect(pg.dsn, autocommit=True) for _ in range(60)]
    try:
        (count,) = connections[0].execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'commitline'"
        ).fetchone()  # type: ignore[misc]
        assert count >= 60
    finally:
        for conn in connections:
            conn.close()


def test_postgres_restarts_after_postmaster_sigkill(pg: EmbeddedPostgres) -> None:
    pg.start()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE crashy (id int)")
        conn.execute("INSERT INTO crashy VALUES (7)")  # committed with fsync on
    pid = int((pg.data_dir / "postmaster.pid").read_text().splitlines()[0])
    os.kill(pid, signal.SIGKILL)  # leaves a stale postmaster.pid behind

    started = time.perf_counter()
    pg.start()
    print(f"postgres start after SIGKILL (crash recovery): {time.perf_counter() - started:.2f} s")
    with psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SELECT id FROM crashy").fetchall() == [(7,)]
    assert "automatic recovery in progress" in pg.log_path.read_text()


def test_postgres_start_failure_quotes_server_log(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy_port = blocker.getsockname()[1]
        server = EmbeddedPostgres(tmp_path / "pgdata", port=busy_port, start_timeout=10)
        try:
            with pytest.raises(EmbeddedServiceError, match="Address already in use"):
                server.start()
        finally:
            server.stop()


# -------------------------------------------------------------------- Kafka


@pytest.fixture
def kafka() -> Iterator[EmbeddedKafka]:
    broker = EmbeddedKafka()
    try:
        yield broker
    finally:
        broker.stop()


async def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
        )
        assert [err[1] for err in response.topic_errors] == [0]
        described = await admin.describe_topics([topic])
        assert len(described[0]["partitions"]) == partitions
    finally:
        await admin.close()


Headers = list[tuple[str, bytes]]


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, Headers]]) -> list[int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        partitions = []
        for key, value, headers in records:
            meta = await producer.send_and_wait(topic, value, key=key, headers=headers)
            partitions.append(meta.partition)
        return partitions
    finally:
        await producer.stop()


async def _consume_all(bootstrap: str, topic: str, expected: int) -> list[tuple[int, bytes, bytes, Headers]]:
    # A consumer group (short session timeout: Tansu holds a group's first
    # JoinGroup for about session_timeout_ms / 2).
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id="embedded-test",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=2000,
        heartbeat_interval_ms=500,
    )
    await consumer.start()
    try:
        seen: list[tuple[int, bytes, bytes, Headers]] = []
        deadline = time.monotonic() + 15
        while len(seen) < expected and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                for m in messages:
                    seen.append((m.partition, m.key, m.value, list(m.headers)))
        await consumer.commit()
        return seen
    finally:
        await consumer.stop()


def test_kafka_produce_and_consume_keyed_records_with_headers(kafka: EmbeddedKafka) -> None:
    started = time.perf_counter()
    kafka.start()
    print(f"tansu start (incl. metadata probe): {time.perf_counter() - started:.3f} s")
    kafka.start()  # idempotent
    assert kafka.bootstrap_servers == f"127.0.0.1:{kafka.port}"
    bootstrap = kafka.bootstrap_servers

    asyncio.run(_create_topic(bootstrap, "commits", partitions=3))
    records = [
        (f"stream-{i % 4}".encode(), f"event-{i}".encode(), [("event-type", b"Committed"), ("seq", str(i).encode())])
        for i in range(12)
    ]
    partitions = asyncio.run(_produce(bootstrap, "commits", records))
    # the same key always lands on the same partition
    by_key: dict[bytes, set[int]] = {}
    for (key, _, _), partition in zip(records, partitions, strict=True):
        by_key.setdefault(key, set()).add(partition)
    assert all(len(parts) == 1 for parts in by_key.values())

    consumed = asyncio.run(_consume_all(bootstrap, "commits", expected=len(records)))
    assert sorted((k, v, h) for _, k, v, h in consumed) == sorted(records)
    # per partition, records come back in produce order
    for partition in set(partitions):
        produced_here = [v for (_, v, _), p in zip(records, partitions, strict=True) if p == partition]
        consumed_here = [v for p, _, v, _ in consumed if p == partition]
        assert consumed_here == produced_here


def test_kafka_auto_creates_unknown_topics_with_four_partitions(kafka: EmbeddedKafka) -> None:
    kafka.start()

    async def scenario() -> int:
        await _produce(kafka.bootstrap_servers, "never-created", [(b"k", b"v", [])])
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
        await producer.start()
        try:
            return len(await producer.partitions_for("never-created"))
        finally:
            await producer.stop()

    assert asyncio.run(scenario()) == 4


def test_kafka_kill_then_restart_on_same_port(kafka: EmbeddedKafka) -> None:
    kafka.start()
    port = kafka.port
    asyncio.run(_create_topic(kafka.bootstrap_servers, "before-outage", partitions=1))

    kafka.kill()
    kafka.kill()  # harmless twice
    assert kafka.pid is None
    assert not listens(port, timeout=0.5)

    started = time.perf_counter()
    kafka.start()
    print(f"tansu restart after SIGKILL: {time.perf_counter() - started:.3f} s")
    assert kafka.port == port and kafka.bootstrap_servers == f"127.0.0.1:{port}"

    async def topics() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    assert "before-outage" not in asyncio.run(topics())  # memory storage: all gone

    kafka.stop()
    kafka.stop()  # safe twice
    assert not listens(port, timeout=0.5)


def test_kafka_start_works_inside_a_running_event_loop(kafka: EmbeddedKafka) -> None:
    async def caller() -> None:
        kafka.start()  # blocking, but must not trip over the running loop

    asyncio.run(caller())
    assert listens(kafka.port, timeout=0.5)


def test_kafka_start_failure_quotes_broker_output() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        broker = EmbeddedKafka(port=blocker.getsockname()[1], start_timeout=10)
        try:
            with pytest.raises(EmbeddedServiceError, match="Address in use"):
                broker.start()
        finally:
            broker.stop()
