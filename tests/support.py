"""Helpers shared by the integration tests."""

from __future__ import annotations

import psycopg

from commitline.infrastructure.config import Settings


def settings_for(dsn: str, schema: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": dsn, "schema_name": schema, "pool_size": 4, "pool_max_overflow": 76,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def count_rows(dsn: str, schema: str) -> dict[str, int]:
    tables = ("events", "idempotency_keys", "snapshots")
    with psycopg.connect(dsn) as conn:
        return {t: conn.execute(f'SELECT count(*) FROM "{schema}".{t}').fetchone()[0] for t in tables}
