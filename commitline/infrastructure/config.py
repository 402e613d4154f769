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


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    values = {v.field: env[v.name] for v in VARIABLES if env.get(v.name, "") != ""}
    try:
        return Settings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        name = next((v.name for v in VARIABLES if v.field == field), field)
        shown = "" if field == "database_url" else f" (got {values.get(field)!r})"
        raise ConfigurationError(name, f"{first['msg']}{shown}") from None
