"""The live projector: one follower per projection, the single writer of its tables.

While it holds the projection's lease it reads the gap-safe log after its position,
applies each batch and moves the position in one transaction on the lease's own
connection (so a lost lease cannot write). A second instance waits for the lease. When a
rebuild is waiting to swap its tables in, the projector yields the lease and takes it
back afterwards. At a poison event it stops and waits for ``projections retry`` or
``projections skip``; it never passes the event by itself.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.followers.engine import LeasedFollower
from commitline.infrastructure.followers.lease import POSITIONS_TABLE, Lease, instance_id
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.followers.wakeup import LogWakeup, wait_or_stop
from commitline.projections.base import Projection
from commitline.projections.batches import apply_batch
from commitline.projections.storage import create_tables

log = logging.getLogger(__name__)


@dataclass
class ProjectorMetrics:
    events_applied: int = 0
    batches: int = 0
    position: int = 0
    poisoned_at: int | None = None


class Projector(LeasedFollower):
    def __init__(self, projection: Projection, recorder: EventRecorder, conninfo: dict, *, batch_size: int = 2000,
                 poll_interval: float = 1.0, owner: str | None = None):
        self.projection = projection
        self.recorder = recorder
        self.schema = recorder.datastore.schema
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.lease = Lease(conninfo, self.schema, projection.name, owner or instance_id())
        self.wakeup = LogWakeup(conninfo, recorder.channel_name)
        self.metrics = ProjectorMetrics()

    async def work_while_owner(self, stop: asyncio.Event) -> None:
        await asyncio.to_thread(self.lease.run, lambda conn: create_tables(conn, self.schema, self.projection))
        position, status = await asyncio.to_thread(self.lease.run, self._own_row)
        self.metrics.position = position
        while not stop.is_set():
            if await asyncio.to_thread(self.lease.has_waiters):
                log.info("%s: yielding the lease to a rebuild", self.projection.name)
                await asyncio.to_thread(self.lease.release, "yielded")
                await wait_or_stop(stop, 1.0)
                return
            if status == "failed":  # poison: wait for an operator's retry or skip
                await wait_or_stop(stop, 1.0)
                position, status = await asyncio.to_thread(self.lease.run, self._own_row)
                continue
            batch = await asyncio.to_thread(self.recorder.select_notifications, position + 1, self.batch_size)
            if not batch:
                await self.wakeup.wait(self.poll_interval)
                continue
            outcome = await asyncio.to_thread(self.lease.run, lambda conn: apply_batch(
                conn, self.schema, self.projection, self.projection.name, position, batch))
            position = outcome.position
            self.metrics.position = position
            self.metrics.events_applied += outcome.applied
            self.metrics.batches += 1
            if outcome.poison is not None:
                status = "failed"
                self.metrics.poisoned_at = outcome.poison["position"]
                log.critical("projection %s stopped at poison event %s: %s", self.projection.name,
                             outcome.poison["position"], outcome.poison["message"])

    def _own_row(self, conn) -> tuple[int, str]:
        row = conn.cursor(row_factory=tuple_row).execute(
            SQL("SELECT position, status FROM {} WHERE name = %s").format(Identifier(self.schema, POSITIONS_TABLE)),
            (self.projection.name,)).fetchone()
        return int(row[0]), str(row[1])
