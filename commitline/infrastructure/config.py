"""Configuration from environment variables, validated once at start.

Every variable is listed in ``VARIABLES`` (name, default, meaning) and in the README.
A bad value raises ConfigurationError naming the variable and what is wrong; the
database URL is a secret and is never echoed in errors, logs or ``repr``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from commitline.application.errors import ConfigurationError


@dataclass(frozen=True)
class Variable:
    name: str
    field: str
    default: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("COMMITLINE_DATABASE_URL", "database_url", "(unset: embedded PostgreSQL)",
             "PostgreSQL URL, e.g. postgresql://user:password@host:5432/db (secret: never logged)"),
    Variable("COMMITLINE_DATA_DIR", "data_dir", ".commitline", "folder for the embedded PostgreSQL's data"),
    Variable("COMMITLINE_SCHEMA", "schema_name", "commitline", "PostgreSQL schema holding commitline's tables"),
    Variable("COMMITLINE_POOL_SIZE", "pool_size", "10", "connections kept open in the pool"),
    Variable("COMMITLINE_POOL_MAX_OVERFLOW", "pool_max_overflow", "40", "extra connections opened under load"),
    Variable("COMMITLINE_SNAPSHOT_INTERVAL", "snapshot_interval", "100",
             "take a snapshot every N events of a stream (0 disables)"),
    Variable("COMMITLINE_RETRY_MAX_ATTEMPTS", "retry_max_attempts", "10",
             "attempts for a command without expected_version when its stream keeps moving"),
    Variable("COMMITLINE_RETRY_BASE_DELAY_MS", "retry_base_delay_ms", "5", "first back-off cap, doubled per retry"),
    Variable("COMMITLINE_RETRY_MAX_DELAY_MS", "retry_max_delay_ms", "500", "largest back-off between retries"),
    Variable("COMMITLINE_LOG_LEVEL", "log_level", "INFO", "DEBUG, INFO, WARNING or ERROR"),
    Variable("KAFKA_BOOTSTRAP_SERVERS", "kafka_bootstrap_servers", "(unset: embedded Tansu broker)",
             "Kafka bootstrap servers, host:port[,host:port]"),
    Variable("COMMITLINE_KAFKA_TOPIC_PREFIX", "kafka_topic_prefix", "commitline.",
             "topic name = prefix + aggregate type, e.g. commitline.PaymentTransaction"),
    Variable("COMMITLINE_KAFKA_PARTITIONS", "kafka_partitions", "6", "partitions of topics the publisher creates"),
    Variable("COMMITLINE_KAFKA_REPLICATION_FACTOR", "kafka_replication_factor", "1",
             "replication factor of topics the publisher creates"),
    Variable("COMMITLINE_KAFKA_IDEMPOTENCE", "kafka_idempotence", "true",
             "idempotent producer (needs a broker that supports InitProducerId; the embedded one does not)"),
    Variable("COMMITLINE_KAFKA_SECURITY_PROTOCOL", "kafka_security_protocol", "PLAINTEXT",
             "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    Variable("COMMITLINE_KAFKA_SASL_MECHANISM", "kafka_sasl_mechanism", "PLAIN", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    Variable("COMMITLINE_KAFKA_USERNAME", "kafka_username", "(unset)", "SASL user name"),
    Variable("COMMITLINE_KAFKA_PASSWORD", "kafka_password", "(unset)", "SASL password (secret: never logged)"),
    Variable("COMMITLINE_PUBLISH_BATCH_SIZE", "publish_batch_size", "2000", "events read from the log per batch"),
    Variable("COMMITLINE_PUBLISH_POLL_INTERVAL_MS", "publish_poll_interval_ms", "1000",
             "longest wait for new events when no NOTIFY wake-up arrives"),
    Variable("COMMITLINE_PUBLISH_MAX_BACKOFF_MS", "publish_max_backoff_ms", "10000",
             "longest pause between attempts while the broker is failing"),
    Variable("COMMITLINE_PROJECT_BATCH_SIZE", "project_batch_size", "5000",
             "events applied per projection transaction (live and rebuild)"),
    Variable("COMMITLINE_METRICS_INTERVAL_S", "metrics_interval_s", "30", "how often followers log their metrics"),
)


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    database_url: SecretStr | None = None
    data_dir: Path = Path(".commitline")
    schema_name: str = Field("commitline", pattern=r"^[a-z_][a-z0-9_]{0,40}$")
    pool_size: int = Field(10, ge=1, le=500)
    pool_max_overflow: int = Field(40, ge=0, le=1000)
    snapshot_interval: int = Field(100, ge=0)
    retry_max_attempts: int = Field(10, ge=1, le=100)
    retry_base_delay_ms: float = Field(5, ge=0)
    retry_max_delay_ms: float = Field(500, ge=0)
    log_level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    kafka_bootstrap_servers: str | None = Field(None, pattern=r"^[^,\s]+:\d+(,[^,\s]+:\d+)*$")
    kafka_topic_prefix: str = Field("commitline.", pattern=r"^[A-Za-z0-9._-]{0,200}$")
    kafka_partitions: int = Field(6, ge=1, le=10_000)
    kafka_replication_factor: int = Field(1, ge=1, le=10)
    kafka_idempotence: bool = True
    kafka_security_protocol: str = Field("PLAINTEXT", pattern=r"^(PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL)$")
    kafka_sasl_mechanism: str = Field("PLAIN", pattern=r"^(PLAIN|SCRAM-SHA-256|SCRAM-SHA-512)$")
    kafka_username: str | None = None
    kafka_password: SecretStr | None = None
    publish_batch_size: int = Field(2000, ge=1, le=100_000)
    publish_poll_interval_ms: float = Field(1000, gt=0)
    publish_max_backoff_ms: float = Field(10_000, gt=0)
    project_batch_size: int = Field(5000, ge=1, le=100_000)
    metrics_interval_s: float = Field(30, gt=0)

    @field_validator("database_url")
    @classmethod
    def _parsable_url(cls, url: SecretStr | None) -> SecretStr | None:
        if url is not None:
            try:
                conninfo_to_dict(url.get_secret_value())
            except Exception:
                raise ValueError("is not a valid PostgreSQL connection URL") from None
        return url

    def connection_parts(self) -> dict[str, Any]:
        """host, port, dbname, user, password of the configured database (secret included)."""
        assert self.database_url is not None
        parts = conninfo_to_dict(self.database_url.get_secret_value())
        return {
            "host": parts.get("host", "127.0.0.1"),
            "port": int(parts.get("port", 5432)),
            "dbname": parts.get("dbname", "postgres"),
            "user": parts.get("user", "postgres"),
            "password": parts.get("password", ""),
        }


_SECRETS = {"database_url", "kafka_password"}


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    values = {v.field: env[v.name] for v in VARIABLES if env.get(v.name, "") != ""}
    try:
        return Settings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        name = next((v.name for v in VARIABLES if v.field == field), field)
        shown = "" if field in _SECRETS else f" (got {values.get(field)!r})"
        raise ConfigurationError(name, f"{first['msg']}{shown}") from None
