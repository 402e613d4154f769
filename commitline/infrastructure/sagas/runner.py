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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from uuid import UUID

from eventsourcing.persistence import Notification

from commitline.application.fulfilment import FulfilmentSaga
from commitline.domain.fulfilment import FulfilmentRetried
from commitline.domain.order import OrderPlaced
from commitline.infrastructure.followers.engine import Follower, Handled
from commitline.infrastructure.store.codec import decode_event
from commitline.infrastructure.store.recorder import EventRecorder

log = logging.getLogger(__name__)
RUNNER = "order-fulfilment"
TRIGGERS = {OrderPlaced.type_name(), FulfilmentRetried.type_name()}


@dataclass
class RunnerMetrics:
    position: int = 0
    advanced: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


class FulfilmentRunner(Follower):
    retry_on = (Exception,)  # a batch is retried until every saga in it has gone as far as it can

    def __init__(self, saga: FulfilmentSaga, recorder: EventRecorder, conninfo: dict, *, batch_size: int = 500,
                 workers: int = 8, poll_interval: float = 1.0, owner: str | None = None):
        super().__init__(recorder, conninfo, RUNNER, batch_size=batch_size, poll_interval=poll_interval, owner=owner)
        self.saga = saga
        self.workers = workers
        self.metrics = RunnerMetrics()

    async def handle(self, batch: Sequence[Notification], position: int) -> Handled:
        triggers: list[tuple[UUID | None, UUID, str]] = []  # (order id if the event names it, aggregate id, tenant)
        for n in batch:
            if n.topic in TRIGGERS:
                recorded = decode_event(n.topic, n.originator_id, n.originator_version, n.state)
                event = recorded.event
                order_id = event.aggregate_id if isinstance(event, OrderPlaced) else event.order_id
                triggers.append((order_id, event.aggregate_id, recorded.tenant))
        await asyncio.to_thread(self._advance_all, triggers)
        return Handled(batch[-1].id)

    def _advance_all(self, triggers: list[tuple[UUID | None, UUID, str]]) -> None:
        orders: dict[UUID, str] = {}
        for order_id, aggregate_id, tenant in triggers:
            # A retry recorded before its event named the order: the saga's own stream knows it.
            orders.setdefault(order_id or self.saga.order_of(aggregate_id, tenant), tenant)
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
