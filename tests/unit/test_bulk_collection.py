"""Bulk work (a rebuild, a process running its followers) tunes the garbage collector only while it runs: the
thresholds are set back and what it froze is unfrozen afterwards, also when it fails."""

from __future__ import annotations

import gc

import pytest

from commitline.infrastructure.collection import BULK_THRESHOLDS, bulk_collection


def test_the_collector_is_set_back_after_bulk_work_even_failed_work() -> None:
    before = gc.get_threshold()
    assert before != BULK_THRESHOLDS
    gc.unfreeze()
    with bulk_collection():
        assert gc.get_threshold() == BULK_THRESHOLDS
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0, "nothing was frozen before: nothing stays frozen"
    with pytest.raises(RuntimeError), bulk_collection():
        raise RuntimeError("a poison event")
    assert gc.get_threshold() == before
