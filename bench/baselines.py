"""The throughput bench's two plain-psycopg baselines (``command_throughput`` measures them beside commitline).

Each writer keeps one connection of its own for the whole measurement, opened beforehand (autocommit,
``search_path`` on the bench schema), as commitline's writers keep theirs: a pool check-out per command
would cost the baselines about 8% that commitline does not pay.

- :func:`measure_state_stored`: the design the seeds use instead of event sourcing (seed 002's write path):
  one row per item with a version column; per command one read (the idempotency key's row and the item's row,
  one statement), then one transaction, pipelined: ``UPDATE items SET state, version = version + 1 WHERE id AND
  version``, an outbox ``INSERT`` and an idempotency-key ``INSERT``.
- :func:`measure_raw_insert`: the ceiling: one-row ``INSERT`` transactions (autocommit). Nothing can do a
  command in fewer commits.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
from psycopg import sql

from bench.driving import Measurement, drive
from bench.harness import BenchContext
from commitline.application.errors import ConcurrencyConflict


@contextlib.contextmanager
def writer_connections(ctx: BenchContext, schema: str, writers: int) -> Iterator[list[psycopg.Connection[Any]]]:
    """One autocommit connection per writer (its ``search_path`` the bench schema), all closed at the end."""
    conns: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(writers):
            conns.append(psycopg.connect(ctx.dsn, autocommit=True, options=f"-c search_path={schema}"))
        yield conns
    finally:
        for conn in conns:
            conn.close()


def measure_state_stored(ctx: BenchContext, schema: str, writers: int, warmup: float,
                         duration: float, cpu: int | None = None) -> Measurement:
    run = uuid.uuid4().hex[:8]
    items, outbox, keys = (sql.Identifier(f"ss_{name}_{run}") for name in ("items", "outbox", "keys"))
    with writer_connections(ctx, schema, writers) as conns:
        conn = conns[0]
        conn.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY, state jsonb NOT NULL, version int8 NOT NULL)")
                     .format(items))
        conn.execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, aggregate_id uuid NOT NULL, "
                             "type text NOT NULL, payload jsonb NOT NULL, published boolean NOT NULL DEFAULT "
                             "false)").format(outbox))
        conn.execute(sql.SQL("CREATE TABLE {} (tenant text, key text, response jsonb NOT NULL, "
                             "PRIMARY KEY (tenant, key))").format(keys))
        ids = [uuid.uuid4() for _ in range(writers)]
        for i in ids:
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, 1)").format(items),
                         (i, orjson.dumps({"on_hand": 1}).decode()))
        read = sql.SQL("SELECT i.state, i.version, (SELECT response FROM {} WHERE tenant = %s AND key = %s) "
                       "FROM {} i WHERE i.id = %s").format(keys, items)
        update = sql.SQL("UPDATE {} SET state = %s, version = version + 1 WHERE id = %s AND version = %s").format(items)
        to_outbox = sql.SQL("INSERT INTO {} (aggregate_id, type, payload) VALUES (%s, %s, %s)").format(outbox)
        to_keys = sql.SQL("INSERT INTO {} (tenant, key, response) VALUES (%s, %s, %s)").format(keys)

        def command(i: int, seq: int) -> None:
            key = f"{run}-{i}-{seq}"
            conn = conns[i]
            state, version, earlier = conn.execute(read, ("default", key, ids[i]), prepare=True).fetchone()
            if earlier is not None:
                return
            state = {**state, "on_hand": state["on_hand"] + 1}
            payload = orjson.dumps({"quantity": 1}).decode()
            with conn.pipeline(), conn.transaction():
                moved = conn.execute(update, (orjson.dumps(state).decode(), ids[i], version), prepare=True)
                conn.execute(to_outbox, (ids[i], "StockReceived", payload), prepare=True)
                conn.execute(to_keys, ("default", key, orjson.dumps({"version": version + 1}).decode()),
                             prepare=True)
            if moved.rowcount != 1:
                raise ConcurrencyConflict(ids[i], version, None)

        return drive(writers, command, warmup, duration, cpu)


def measure_raw_insert(ctx: BenchContext, schema: str, writers: int, warmup: float, duration: float,
                       cpu: int | None = None) -> Measurement:
    table = sql.Identifier(f"raw_{uuid.uuid4().hex[:8]}")
    with writer_connections(ctx, schema, writers) as conns:
        conns[0].execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, payload bytea NOT NULL)").format(table))
        insert = sql.SQL("INSERT INTO {} (payload) VALUES (%s)").format(table)
        payload = bytes(100)

        def command(i: int, seq: int) -> None:
            conns[i].execute(insert, (payload,), prepare=True)

        return drive(writers, command, warmup, duration, cpu)
