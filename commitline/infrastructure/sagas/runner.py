"""Runs the order-fulfilment process manager as a follower of the notification log.

While it holds the ``order-fulfilment`` lease it reads the log after its position, and for
every OrderPlaced (and every operator retry of a stuck saga) advances that order's saga,
several orders in parallel. The position moves only after every saga of the batch has gone
as far as it can; after a crash the batch is handled again, which is safe because
``FulfilmentSaga.advance`` is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from uuid import UUID

from commitline.application.fulfilment import FulfilmentSaga
from commitline.domain.order import FulfilmentRetried, OrderPlaced
from commitline.infrastructure.store.codec import decode_event
from commitline.infrastructure.followers.engine import LeasedFollower
from commitline.infrastructure.followers.lease import Lease, instance_id
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.followers.wakeup import LogWakeup, wait_or_stop

log = logging.getLogger(__name__)
RUNNER = "order-fulfilment"
TRIGGERS = {OrderPlaced.type_name(), FulfilmentRetried.type_name()}


@dataclass
class RunnerMetrics:
    position: int = 0
    advanced: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


class FulfilmentRunner(LeasedFollower):
    def __init__(self, saga: FulfilmentSaga, recorder: EventRecorder, conninfo: dict, *, batch_size: int = 500,
                 workers: int = 8, poll_interval: float = 1.0, owner: str | None = None):
        self.saga = saga
        self.recorder = recorder
        self.batch_size = batch_size
        self.workers = workers
        self.poll_interval = poll_interval
        self.lease = Lease(conninfo, recorder.datastore.schema, RUNNER, owner or instance_id())
        self.wakeup = LogWakeup(conninfo, recorder.channel_name)
        self.metrics = RunnerMetrics()

    async def work_while_owner(self, stop: asyncio.Event) -> None:
        position = await asyncio.to_thread(self.lease.position)
        failures = 0
        while not stop.is_set():
            batch = await asyncio.to_thread(self.recorder.select_notifications, position + 1, self.batch_size)
            if not batch:
                await self.wakeup.wait(self.poll_interval)
                continue
            orders: dict[UUID, str] = {}
            for n in batch:
                if n.topic in TRIGGERS:
                    recorded = decode_event(n.topic, n.originator_id, n.originator_version, n.state)
                    order_id = getattr(recorded.event, "order_id", recorded.event.aggregate_id)
                    orders.setdefault(order_id, recorded.tenant)
            try:
                await asyncio.to_thread(self._advance_all, orders)
            except Exception as e:
                failures += 1
                log.error("advancing %d sagas failed (%s: %s); retrying the batch", len(orders), type(e).__name__, e)
                await asyncio.to_thread(self.lease.set_status, "retrying", {"message": f"{type(e).__name__}: {e}",
                                                                             "position": batch[0].id})
                await wait_or_stop(stop, min(10.0, 0.2 * 2 ** failures))
                continue
            failures = 0
            position = batch[-1].id
            await asyncio.to_thread(self.lease.save_position, position)
            self.metrics.position = position

    def _advance_all(self, orders: dict[UUID, str]) -> None:
        if not orders:
            return
        with ThreadPoolExecutor(max_workers=min(self.workers, len(orders))) as pool:
            futures = [pool.submit(self.saga.advance, order_id, tenant) for order_id, tenant in orders.items()]
            errors = []
            for future in futures:
                try:
                    self.metrics.outcomes[future.result().value] += 1
                    self.metrics.advanced += 1
                except Exception as e:  # every saga gets its chance before the batch is retried
                    errors.append(e)
        if errors:
            raise errors[0]
