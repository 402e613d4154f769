"""Helpers shared by the integration tests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg

from commitline.application import commands
from commitline.examples import domain as examples_domain
from commitline.infrastructure.config import Settings
from commitline.infrastructure.followers.thread import FollowerThread
from commitline.infrastructure.kafka.reader import ConsumedRecord, read_topics
from commitline.infrastructure.personal.master import generate as generate_master_key
from commitline.infrastructure.store.snapshot_writer import flush_all

__all__ = ["AGGREGATES", "COMMAND_TYPES", "EXAMPLES", "MASTER_KEY", "PROJECTIONS", "RUNNER", "SAGA_COMMANDS",
           "ConsumedRecord", "FollowerThread", "count_rows", "kafka_settings", "parse_command", "read_topics",
           "hold_open_insert", "settings_for", "wait_for"]


#: The master key of this test run's personal data, also in the environment of every process a test starts
MASTER_KEY = os.environ.setdefault("COMMITLINE_MASTER_KEY", generate_master_key())


def settings_for(dsn: str, schema: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": dsn, "schema_name": schema, "pool_size": 4, "pool_max_overflow": 76, "master_key": MASTER_KEY,
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
    """The rows of the store's tables, once the snapshots this process's apps have taken are written."""
    assert flush_all(60), "snapshots still unwritten after 60 s"
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


# -- the built-in examples, the domain most tests run --------------------------------------------------------
EXAMPLES = examples_domain.check()
COMMAND_TYPES = EXAMPLES.catalog.public
SAGA_COMMANDS = [cls for cls, handler in EXAMPLES.catalog.handlers.items() if handler.internal]
PROJECTIONS = EXAMPLES.projections
AGGREGATES = EXAMPLES.registry.aggregates
RUNNER = "order-fulfilment"


def parse_command(command: Any, **options: Any) -> Any:
    """``commitline.application.commands.parse_command`` over the examples' commands."""
    return commands.parse_command(command, EXAMPLES.catalog, **options)


# -- the examples' order-fulfilment saga, as the tests drive it ----------------------------------------------

def make_saga(app: Any, gateway: Any = None, **options: Any) -> Any:
    """The examples' fulfilment process manager over ``gateway`` (default: the configured ``payments`` port)."""
    return app.process_manager(RUNNER, ports=None if gateway is None else {"payments": gateway}, **options)


def fulfilment_runner(app: Any, manager: Any = None, **options: Any) -> Any:
    return app.process_runner(manager if manager is not None else RUNNER, **options)


def simulated_gateway(app: Any) -> Any:
    from commitline.examples.simulated_gateway import SimulatedGateway

    return SimulatedGateway(app.conninfo, app.settings.schema_name)


def configured_gateway(app: Any) -> Any:
    """The configured payment gateway (``COMMITLINE_GATEWAY``), as the examples' ``payments`` port makes it."""
    return app.port("payments")


def hold_open_insert(pg_dsn: str, schema: str, aggregate: UUID, topic: str, drawn: threading.Event,
                     release: threading.Event) -> None:
    """Draw the next notification id for an event of ``topic`` on ``aggregate`` (``drawn`` is set then) and hold
    its transaction open until ``release``, then commit it: a writer that commits after writers that came later."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SELECT pg_current_xact_id()")
        conn.execute(
            f"INSERT INTO {schema}.events (originator_id, originator_version, topic, state, prev_hash, event_hash) "
            "VALUES (%s, 1, %s, %s, %s, %s)", (aggregate, topic, b"{}", bytes(32), bytes(32)))
        drawn.set()
        release.wait(30)
        conn.commit()
