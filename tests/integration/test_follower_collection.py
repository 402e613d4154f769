"""A process whose job is to run followers (``run_until_signalled``: ``commitline publish``, ``projections run``,
``sagas run``) runs them under the collector's bulk settings, and sets the collector back when they end, also
when one fails."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from commitline.composition import Commitline
from commitline.infrastructure.collection import BULK_THRESHOLDS


class Probe:
    """A follower that notes the collector's settings while it runs, then has caught up (or fails)."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.seen: tuple[Any, ...] | None = None
        self.on_caught_up: Any = None
        self.on_poisoned: Any = None

    async def run(self, stop: asyncio.Event) -> None:
        self.seen = (gc.get_threshold(), gc.get_freeze_count())
        if self.fail:
            raise RuntimeError("the follower failed")
        self.on_caught_up()


def test_followers_run_under_the_bulk_settings_and_the_collector_is_set_back(app: Commitline) -> None:
    before = gc.get_threshold()
    assert before != BULK_THRESHOLDS
    gc.unfreeze()
    probe = Probe()
    app.run_until_signalled(probe, drain=True)  # type: ignore[arg-type]
    assert probe.seen is not None, "the follower ran"
    assert probe.seen[0] == BULK_THRESHOLDS, probe.seen
    assert probe.seen[1] > 0, "what existed when the followers started was frozen"
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0, "nothing was frozen before: nothing stays frozen"

    failing = Probe(fail=True)
    with pytest.raises(RuntimeError, match="the follower failed"):
        app.run_until_signalled(failing, drain=True)  # type: ignore[arg-type]
    assert failing.seen is not None and failing.seen[0] == BULK_THRESHOLDS
    assert gc.get_threshold() == before
