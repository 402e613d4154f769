"""The live projector: one follower per projection, the single writer of its tables.

While it holds the projection's lease it reads the gap-safe log after its position,
applies each batch and moves the position in one transaction on the lease's own
connection (so a lost lease cannot write). A second instance waits for the lease. When a
rebuild is waiting to swap its tables in, the projector yields the lease and takes it
back afterwards. Tables found with another shape than declared stop it at start: its status is ``failed``
with ``ProjectionNeedsRebuild``'s message and command, it never writes into them, and it waits (the process's
other projectors going on) until a rebuild swaps tables of its shape in, then goes on by itself. At a poison
event it stops and waits for ``projections retry`` or ``projections skip``; it never passes the event by itself.
An event it cannot read for want of the right release or master key is no poison event: it retries it, its
status ``retrying`` with the error, until a process that can read it takes over (a rolling upgrade's next one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eventsourcing.persistence import Notification

from commitline.application.errors import ConfigurationError
from commitline.infrastructure.followers.engine import Follower, Handled, WaitingForOperator
from commitline.infrastructure.store.codec import EventCodec
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.projections.base import Projection
from commitline.projections.batches import apply_batch
from commitline.projections.storage import ProjectionNeedsRebuild, check_shape, create_tables, empty_stale_tables


log = logging.getLogger(__name__)


@dataclass
class ProjectorMetrics:
    events_applied: int = 0
    batches: int = 0
    position: int = 0
    poisoned_at: int | None = None


class Projector(Follower):
    yields_to_waiters = True  # a rebuild waiting to swap its tables in gets the lease
    #: an event this process cannot read (a newer release's, one under a master key it lacks) is not poison: the
    #: batch is retried, its status ``retrying`` with the error, until the process is redeployed (``apply_batch``)
    retry_on = (ConfigurationError,)

    def __init__(self, projection: Projection, codec: EventCodec, recorder: EventRecorder, conninfo: dict, *,
                 batch_size: int = 2000, poll_interval: float = 1.0, owner: str | None = None):
        super().__init__(recorder, conninfo, projection.name, batch_size=batch_size, poll_interval=poll_interval,
                         owner=owner)
        self.projection = projection
        self.codec = codec
        self.schema = recorder.datastore.schema
        self.metrics = ProjectorMetrics()

    async def on_owner(self) -> None:
        """Create the tables on a first start (at position 0, empty them of rows another history left:
        ``empty_stale_tables``); when they exist with another shape than declared, record
        ``ProjectionNeedsRebuild`` as the follower's error (``status`` and ``projections list`` show it) and wait
        for the rebuild (``WaitingForOperator``)."""

        def prepare(conn: Any) -> tuple[list[str], list[str]]:
            with conn.transaction():
                differences, stale = check_shape(conn, self.schema, self.projection), []
                if not differences:
                    create_tables(conn, self.schema, self.projection)
                    if self.lease.positions.read(conn, self.lease.name)[0] == 0:
                        stale = empty_stale_tables(conn, self.schema, self.projection)
                return differences, stale

        differences, stale = await asyncio.to_thread(self.lease.run, prepare)
        if stale:
            log.warning("projection %s has applied no event yet its tables held rows (%s), left from another "
                        "history (a restore of a backup older than the projection?): emptied them, it projects "
                        "from the first event", self.projection.name, ", ".join(stale))
        if differences:
            refused = ProjectionNeedsRebuild(self.projection.name, differences)
            position = await asyncio.to_thread(self.lease.position)
            # 'failed' survives the lease's release (a plain status would become 'stopped'); the rebuild's swap
            # moves the position and so sets it back to 'running'.
            await asyncio.to_thread(self.lease.set_status, "failed", {
                "message": str(refused), "position": position, "needs_rebuild": differences,
                "command": refused.command})
            raise WaitingForOperator(str(refused)) from refused

    async def handle(self, batch: Sequence[Notification], position: int) -> Handled:
        outcome = await asyncio.to_thread(self.lease.run, lambda conn: apply_batch(
            conn, self.schema, self.projection, self.codec, self.projection.name, position, batch,
            generation=self.lease.generation, waits_for_release=True))
        self.metrics.events_applied += outcome.applied
        self.metrics.batches += 1
        if outcome.poison is not None:
            self.metrics.poisoned_at = outcome.poison["position"]
        return Handled(outcome.position, saved=True, poison=outcome.poison)
