"""Rebuilding a projection from the first event, with no half-built view ever visible.

1. Under the ``NAME@rebuild`` lease, replay the log into fresh ``*__next`` tables, saving
   the rebuild's position with every batch (interrupt it and run it again: it resumes).
2. When caught up, wait for the live lease (the live projector yields it to a waiter),
   apply what arrived meanwhile, then in ONE transaction: drop the live tables, rename
   the rebuilt ones into place and set the live position. Readers see the old complete
   view until that commit and the new complete view after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.followers.lease import POSITIONS_TABLE, Lease, instance_id
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.projections.base import Projection
from commitline.projections.batches import BatchOutcome, apply_batch
from commitline.projections.storage import REBUILD_SUFFIX, create_tables, drop_tables, swap_in

log = logging.getLogger(__name__)


class RebuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class RebuildResult:
    projection: str
    position: int
    events_applied: int
    seconds: float
    resumed_from: int


Progress = Callable[[int, int, int], None]  # (position, head, events applied so far)


def rebuild_name(projection: str) -> str:
    return f"{projection}@rebuild"


def rebuild(projection: Projection, recorder: EventRecorder, conninfo: dict[str, Any], *, batch_size: int = 5000,
            progress: Progress | None = None, swap_timeout: float = 60.0) -> RebuildResult:
    schema = recorder.datastore.schema
    owner = instance_id()
    work = Lease(conninfo, schema, rebuild_name(projection.name), owner)
    if not work.try_acquire():
        raise RebuildError(f"a rebuild of {projection.name} is already running")
    started = time.perf_counter()
    try:
        position = work.run(lambda conn: _prepare(conn, schema, projection, work.name))
        resumed_from, applied = position, 0
        position, applied = _catch_up(work, recorder, projection, position, applied, batch_size, progress)
        live = Lease(conninfo, schema, projection.name, f"rebuild:{owner}")
        if not live.acquire(swap_timeout):
            raise RebuildError(f"the live projector of {projection.name} did not yield within {swap_timeout:.0f} s; "
                               f"the rebuilt tables are kept, run the rebuild again to resume")
        try:
            position, applied = _catch_up(live, recorder, projection, position, applied, batch_size, progress,
                                          follower=work.name)
            live.run(lambda conn: _swap(conn, schema, projection, position, work.name))
        finally:
            live.release("stopped")
        log.info("rebuilt %s up to position %d (%d events applied)", projection.name, position, applied)
        return RebuildResult(projection.name, position, applied, time.perf_counter() - started, resumed_from)
    finally:
        work.release("stopped")


def _prepare(conn: psycopg.Connection[Any], schema: str, projection: Projection, follower: str) -> int:
    """The position to resume from: 0 with fresh tables, or where an interrupted rebuild stopped."""
    position, status = conn.cursor(row_factory=tuple_row).execute(
        SQL("SELECT position, status FROM {} WHERE name = %s").format(Identifier(schema, POSITIONS_TABLE)),
        (follower,)).fetchone()
    first = projection.tables[0].name + REBUILD_SUFFIX
    exists = conn.cursor(row_factory=tuple_row).execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}"."{first}"',)).fetchone()[0]
    if position == 0 or not exists or status == "failed":
        with conn.transaction():
            drop_tables(conn, schema, projection, REBUILD_SUFFIX)
            create_tables(conn, schema, projection, REBUILD_SUFFIX)
            conn.execute(SQL("UPDATE {} SET position = 0, status = 'running', error = NULL WHERE name = %s").format(
                Identifier(schema, POSITIONS_TABLE)), (follower,))
        return 0
    return int(position)


def _catch_up(lease: Lease, recorder: EventRecorder, projection: Projection, position: int, applied: int,
              batch_size: int, progress: Progress | None, follower: str | None = None) -> tuple[int, int]:
    schema = recorder.datastore.schema
    name = follower or lease.name
    while True:
        batch = recorder.select_notifications(position + 1, batch_size)
        head = recorder.max_notification_id() or 0
        if not batch:
            if head <= position:
                return position, applied
            time.sleep(0.05)  # a gap still being proven at the head
            continue
        outcome: BatchOutcome = lease.run(lambda conn: apply_batch(
            conn, schema, projection, name, position, batch, REBUILD_SUFFIX))
        position, applied = outcome.position, applied + outcome.applied
        if progress is not None:
            progress(position, head, applied)
        if outcome.poison is not None:
            raise RebuildError(f"poison event at position {outcome.poison['position']} "
                               f"({outcome.poison['event_type']}): {outcome.poison['message']}")


def _swap(conn: psycopg.Connection[Any], schema: str, projection: Projection, position: int, follower: str) -> None:
    positions = Identifier(schema, POSITIONS_TABLE)
    with conn.transaction():
        create_tables(conn, schema, projection)  # the first rebuild of a projection that never ran live
        swap_in(conn, schema, projection)
        conn.execute(SQL("UPDATE {} SET position = %s, status = 'running', error = NULL, updated_at = now() "
                         "WHERE name = %s").format(positions), (position, projection.name))
        conn.execute(SQL("DELETE FROM {} WHERE name = %s").format(positions), (follower,))
