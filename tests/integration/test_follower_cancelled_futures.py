"""A follower's handler that meets a future a library cancelled under it (aiokafka cancels its record batches'
acknowledgements when it resets its connections in an outage) is a failed attempt like any other: the page is
tried again after the back-off and the follower goes on. Only a stop (its own task cancelled) ends it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from commitline.composition import bootstrap
from commitline.infrastructure.followers.engine import Follower, Handled
from tests.support import settings_for

pytestmark = pytest.mark.integration


class Flaky(Follower):
    """Its first batch awaits a future someone else cancels; every batch after that is handled."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.metrics = SimpleNamespace(position=0)
        self.attempts = 0
        self.handled: list[int] = []
        self.all_handled = threading.Event()
        self.wanted = 0

    async def handle(self, batch: Sequence[Any], position: int) -> Handled:
        self.attempts += 1
        if self.attempts == 1:
            acknowledgement = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(acknowledgement.cancel)
            await acknowledgement
        self.handled.extend(n.id for n in batch)
        if len(self.handled) >= self.wanted:
            self.all_handled.set()
        return Handled(batch[-1].id)


def test_a_future_cancelled_under_the_handler_is_retried_and_a_stop_still_stops(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        for n in range(5):
            app.dispatch({"type": "create_payment", "amount": "1", "currency": "EUR", "account": f"acc-{n}"},
                         idempotency_key=f"cancelled-{n}")
        follower = Flaky(app.recorder, app.conninfo, "flaky", batch_size=100, poll_interval=0.2, max_backoff=0.2)
        follower.wanted = 5
        stop = asyncio.Event()
        ended: list[BaseException | None] = []

        def run() -> None:
            async def main() -> None:
                task = asyncio.create_task(follower.run(stop))
                while not follower.all_handled.is_set() and not task.done():
                    await asyncio.sleep(0.05)
                stop.set()
                await task

            try:
                asyncio.run(main())
                ended.append(None)
            except BaseException as e:  # noqa: BLE001 - the test reports whatever ended it
                ended.append(e)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(120)
        assert not thread.is_alive(), "the follower did not stop"
    assert ended == [None], f"the follower ended with {ended[0]!r}"
    assert follower.attempts >= 2 and sorted(follower.handled) == follower.handled and len(follower.handled) == 5
