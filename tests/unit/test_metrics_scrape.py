"""A scrape during a database outage answers at once with ``commitline_store_up 0``: the status read is given
up on after a bound, whatever the connection pool's own timeout, so a scraper's timeout never turns "store
down" into "target down"."""

from __future__ import annotations

import threading

from commitline.infrastructure.metrics import StoreCollector


def test_a_status_read_that_does_not_answer_in_time_reads_as_store_down() -> None:
    release, ended = threading.Event(), threading.Event()

    def stuck_status() -> object:  # as a read waiting on a pool whose server is gone
        release.wait(60)
        ended.set()
        raise RuntimeError("the pool gave up")

    try:
        metrics = list(StoreCollector(stuck_status, timeout_s=0.2).collect())
        assert not ended.is_set(), "the scrape waited for the read to end"
    finally:
        release.set()
    assert [(m.name, [s.value for s in m.samples]) for m in metrics] == [("commitline_store_up", [0])]


def test_a_failed_status_read_reads_as_store_down() -> None:
    def failing_status() -> object:
        raise ConnectionError("refused")

    metrics = list(StoreCollector(failing_status, timeout_s=5).collect())
    assert [(m.name, [s.value for s in m.samples]) for m in metrics] == [("commitline_store_up", [0])]
