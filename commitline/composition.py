"""The composition root: settings -> database (configured or embedded) -> store -> processor."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import psycopg
from eventsourcing.postgres import PostgresDatastore

from commitline.application.errors import StoreUnavailable
from commitline.application.processor import CommandProcessor
from commitline.application.retry import RetryPolicy
from commitline.infrastructure.config import Settings, load_settings
from commitline.infrastructure.embedded.kafka import EmbeddedKafka
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.store.event_store import PostgresEventStore
from commitline.infrastructure.followers.lease import create_follower_tables
from commitline.infrastructure.store.recorder import EventRecorder

log = logging.getLogger(__name__)


@dataclass
class Commitline:
    """Everything wired together; close it to release connections and stop embedded services."""

    settings: Settings
    datastore: PostgresDatastore
    recorder: EventRecorder
    store: PostgresEventStore
    processor: CommandProcessor
    conninfo: dict[str, Any] = field(repr=False)
    embedded_postgres: EmbeddedPostgres | None = None
    embedded_kafka: EmbeddedKafka | None = None
    _closed: bool = field(default=False, repr=False)

    def dispatch(self, command: Any, *, idempotency_key: str | None, tenant: str = "default"):
        return self.processor.dispatch(command, idempotency_key=idempotency_key, tenant=tenant)

    def with_kafka(self) -> Settings:
        """Settings with a Kafka to publish to: the configured one, or an embedded Tansu broker."""
        if self.settings.kafka_bootstrap_servers is not None:
            return self.settings
        if self.embedded_kafka is None:
            self.embedded_kafka = EmbeddedKafka()
            self.embedded_kafka.start()
            log.info("started embedded Kafka-protocol broker (Tansu) at %s", self.embedded_kafka.bootstrap_servers)
        # Tansu rejects InitProducerId, so the embedded broker runs without producer idempotence.
        return self.settings.model_copy(
            update={"kafka_bootstrap_servers": self.embedded_kafka.bootstrap_servers, "kafka_idempotence": False}
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.datastore.close()
        if self.embedded_kafka is not None:
            self.embedded_kafka.stop()
        if self.embedded_postgres is not None:
            self.embedded_postgres.stop()

    def __enter__(self) -> Commitline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connection_parts(settings: Settings) -> tuple[dict[str, Any], EmbeddedPostgres | None]:
    if settings.database_url is not None:
        return settings.connection_parts(), None
    embedded = EmbeddedPostgres(settings.data_dir.resolve() / "postgres")
    embedded.start()
    log.info("started embedded PostgreSQL at %s", embedded.dsn)
    return Settings(database_url=embedded.dsn).connection_parts(), embedded


def bootstrap(settings: Settings | None = None) -> Commitline:
    settings = settings or load_settings()
    logging.getLogger().setLevel(settings.log_level)
    parts, embedded = connection_parts(settings)
    try:
        # One direct connection first: an unreachable server fails in milliseconds here,
        # where the pool would keep retrying until its timeout.
        psycopg.connect(**parts, connect_timeout=10).close()
        datastore = PostgresDatastore(
            parts["dbname"], parts["host"], parts["port"], parts["user"], parts["password"],
            pool_size=settings.pool_size,
            max_overflow=settings.pool_max_overflow,
            schema=settings.schema_name,
            connect_timeout=10,
        )
        datastore.pool.open(wait=True, timeout=15)
        recorder = EventRecorder(datastore)
        recorder.create_table()
        with datastore.get_connection() as conn:
            create_follower_tables(conn, settings.schema_name)
    except Exception as e:
        if embedded is not None:
            embedded.stop()
        raise StoreUnavailable(_describe(e, parts)) from None
    store = PostgresEventStore(recorder, settings.snapshot_interval)
    retry = RetryPolicy(
        settings.retry_max_attempts, settings.retry_base_delay_ms / 1000, settings.retry_max_delay_ms / 1000
    )
    return Commitline(settings, datastore, recorder, store, CommandProcessor(store, retry), parts, embedded)


def _describe(error: Exception, parts: dict[str, Any]) -> str:
    text = f"{type(error).__name__}: {error}"
    if parts.get("password"):
        text = text.replace(parts["password"], "***")
    return f"cannot use PostgreSQL at {parts['host']}:{parts['port']}/{parts['dbname']} as {parts['user']}: {text}"
