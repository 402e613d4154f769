"""Runs one process manager as a follower of the notification log.

While it holds the lease named after the process manager, it reads the log after its position, and for
every event of the manager's ``triggers`` advances the instance that event concerns, several instances
in parallel. The position moves only after every instance of the batch has gone as far as it can; after
a crash the batch is handled again, which is safe because ``advance`` is idempotent.

One instance's failure never holds up the others: an instance whose advance keeps raising an error no
step handles (a bug, data an external system cannot take) is tried ``manager.attempts`` times with
back-off, then parked with the error as its reason (``manager.park``; the personal values of the events
that triggered it are withheld from it) and the batch moves on;
``commitline sagas retry`` resumes it. An instance that cannot be parked (``park`` not overridden, or
raising) is never passed over: the runner holds at its event, ``retrying`` with the reason in ``status``. Only an outage of the store (which every instance would meet)
retries the whole batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import Notification

from commitline.application.errors import Closed, StoreUnavailable, printable
from commitline.application.process import NotParked, ParkFailed, ProcessManager
from commitline.domain.personal import error_text, personal_values
from commitline.infrastructure.followers.engine import Follower, Handled
from commitline.infrastructure.store.codec import EventCodec
from commitline.infrastructure.store.datastore import store_failures
from commitline.infrastructure.store.recorder import EventRecorder

log = logging.getLogger(__name__)
#: the store itself failing (or closed under the runner, as its process stops): every instance would fail alike
OUTAGES = (StoreUnavailable, Closed, psycopg.OperationalError)
PARKED = "PARKED"


@dataclass
class RunnerMetrics:
    position: int = 0
    advanced: int = 0  # instances that went on (a step taken, or nothing to do yet)
    parked: int = 0  # instances parked after their attempts failed
    outcomes: Counter[str] = field(default_factory=Counter)


class ProcessRunner(Follower):
    retry_on = (Exception,)  # a batch is retried until every instance in it has gone as far as it can

    def __init__(self, manager: ProcessManager, codec: EventCodec, recorder: EventRecorder, conninfo: dict, *,
                 batch_size: int = 500, workers: int = 8, poll_interval: float = 1.0, owner: str | None = None):
        super().__init__(recorder, conninfo, manager.name, batch_size=batch_size, poll_interval=poll_interval,
                         owner=owner)
        self.manager = manager
        self.codec = codec
        self.workers = workers
        self.triggers = {t.type_name() for t in manager.triggers}
        self.metrics = RunnerMetrics()

    async def handle(self, batch: Sequence[Notification], position: int) -> Handled:
        triggered: dict[UUID, str] = {}  # instance id -> tenant, in log order
        personal: dict[UUID, dict[str, Any]] = {}  # instance id -> its triggers' personal values, kept out of reasons
        # A raw driver error (a port's own connection to the store) is the store's outage too, backed off and
        # logged as such by the engine, not as this handler's failure.
        with store_failures(self.conninfo):
            for n in batch:
                if n.topic in self.triggers:
                    recorded = self.codec.decode_event(n.topic, n.originator_id, n.originator_version, n.state)
                    instance = await asyncio.to_thread(self.manager.instance_of, recorded.event, recorded.tenant)
                    triggered.setdefault(instance, recorded.tenant)
                    personal.setdefault(instance, {}).update(personal_values(recorded.event))
            await asyncio.to_thread(self._advance_all, triggered, personal)
        return Handled(batch[-1].id)

    def _advance_all(self, triggered: dict[UUID, str], personal: dict[UUID, dict[str, Any]] | None = None) -> None:
        if not triggered:
            return
        with ThreadPoolExecutor(max_workers=min(self.workers, len(triggered))) as pool:
            futures = [pool.submit(self._advance_or_park, instance, tenant, (personal or {}).get(instance, {}))
                       for instance, tenant in triggered.items()]
            errors = []
            for future in futures:
                try:
                    outcome = future.result()
                    self.metrics.outcomes[str(getattr(outcome, "value", outcome))] += 1
                    if outcome == PARKED:
                        self.metrics.parked += 1
                    else:
                        self.metrics.advanced += 1
                except Exception as e:  # every instance gets its chance before the batch is retried
                    errors.append(e)
        if errors:
            raise errors[0]

    def _advance_or_park(self, instance: UUID, tenant: str, values: dict[str, Any] | None = None) -> str:
        """Advance the instance; park it after ``attempts`` failures, with a reason that withholds ``values``
        (the personal values of the events that triggered it)."""
        manager = self.manager
        attempts = manager.attempts
        reason = ""
        for attempt in range(1, attempts + 1):
            try:
                return manager.advance(instance, tenant)
            except OUTAGES:
                raise
            except Exception as e:
                reason = printable(error_text(e, values or {}), 500)
                log.warning("advancing %s %s failed (attempt %d of %d): %s", manager.name, instance, attempt,
                            attempts, reason)
                if attempt < attempts:
                    time.sleep(manager.backoff * 2 ** (attempt - 1))
        try:
            manager.park(instance, reason, attempts, tenant)
        except (*OUTAGES, NotParked):
            raise
        except Exception as e:  # not recorded as parked: passing it over would lose it, so the runner holds here
            raise ParkFailed(manager.name, instance, attempts, reason,
                             printable(error_text(e, values or {}), 500)) from None
        return PARKED
