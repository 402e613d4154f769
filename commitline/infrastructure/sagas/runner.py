"""Runs the order-fulfilment process manager as a follower of the notification log.

While it holds the ``order-fulfilment`` lease it reads the log after its position, and for
every OrderPlaced (and every operator retry of a stuck saga) advances that order's saga,
several orders in parallel. The position moves only after every saga of the batch has gone
as far as it can; after a crash the batch is handled again, which is safe because
``FulfilmentSaga.advance`` is idempotent.

One saga's failure never holds up the others: a saga whose advance keeps raising an error no step
handles (a bug, data the gateway cannot store) is tried ``saga.attempts`` times with back-off, then
parked with the error as its reason (``FulfilmentParked``) and the batch moves on; ``commitline sagas
retry`` resumes it. Only an outage of the store (which every saga would meet) retries the whole batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from uuid import UUID

import psycopg
from eventsourcing.persistence import Notification

from commitline.application.errors import CommitlineError, StoreUnavailable, printable
from commitline.application.fulfilment import FulfilmentSaga
from commitline.domain.fulfilment import FulfilmentRetried, SagaState
from commitline.domain.order import OrderPlaced
from commitline.infrastructure.followers.engine import Follower, Handled
from commitline.infrastructure.store.codec import decode_event
from commitline.infrastructure.store.recorder import EventRecorder

log = logging.getLogger(__name__)
RUNNER = "order-fulfilment"
TRIGGERS = {OrderPlaced.type_name(), FulfilmentRetried.type_name()}
OUTAGES = (StoreUnavailable, psycopg.OperationalError)  # the store itself failing: every saga would


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
            futures = [pool.submit(self._advance_or_park, order_id, tenant) for order_id, tenant in orders.items()]
            errors = []
            for future in futures:
                try:
                    self.metrics.outcomes[future.result().value] += 1
                    self.metrics.advanced += 1
                except Exception as e:  # every saga gets its chance before the batch is retried
                    errors.append(e)
        if errors:
            raise errors[0]

    def _advance_or_park(self, order_id: UUID, tenant: str) -> SagaState:
        attempts = self.saga.attempts
        for attempt in range(1, attempts + 1):
            try:
                return self.saga.advance(order_id, tenant)
            except OUTAGES:
                raise
            except Exception as e:
                reason = f"{type(e).__name__}: {printable(str(e), 500)}"
                log.warning("advancing the fulfilment of order %s failed (attempt %d of %d): %s",
                            order_id, attempt, attempts, reason)
                if attempt < attempts:
                    time.sleep(self.saga.backoff * 2 ** (attempt - 1))
        try:
            self.saga.park(order_id, reason, attempts, tenant)
        except OUTAGES:
            raise
        except CommitlineError as e:  # nothing to park (no such order): never hold up the other sagas for it
            log.critical("cannot advance nor park the fulfilment of order %s: %s", order_id, e)
            return SagaState.PARKED
        return SagaState.PARKED
