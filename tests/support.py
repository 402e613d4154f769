"""Helpers shared by the integration tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from commitline.infrastructure.config import Settings
from commitline.infrastructure.followers.thread import FollowerThread
from commitline.infrastructure.kafka.reader import ConsumedRecord, read_topics

__all__ = ["ConsumedRecord", "FollowerThread", "count_rows", "kafka_settings", "read_topics", "settings_for",
           "wait_for"]


def settings_for(dsn: str, schema: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": dsn, "schema_name": schema, "pool_size": 4, "pool_max_overflow": 76,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def kafka_settings(dsn: str, schema: str, bootstrap_servers: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "kafka_bootstrap_servers": bootstrap_servers, "kafka_idempotence": False, "kafka_topic_prefix": f"{schema}.",
        "kafka_partitions": 4, "publish_poll_interval_ms": 200, "retry_max_attempts": 30,
    }
    values.update(overrides)
    return settings_for(dsn, schema, **values)


def count_rows(dsn: str, schema: str) -> dict[str, int]:
    tables = ("events", "idempotency_keys", "snapshots")
    with psycopg.connect(dsn) as conn:
        return {t: conn.execute(f'SELECT count(*) FROM "{schema}".{t}').fetchone()[0] for t in tables}


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll ``condition`` until it is truthy and return its value; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return result
