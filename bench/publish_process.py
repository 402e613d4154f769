"""One publish instance as its own process, for ``publisher_throughput`` (measures nothing itself).

``python -m bench.publish_process DSN SCHEMA BOOTSTRAP PREFIX SHARE HEAD`` runs what ``commitline publish
--drain`` runs (``app.publisher()`` on the configured broker, ``app.run_until_signalled(publisher,
drain=True)``) on the bench's schema, with one difference: its bucket log reads nothing until the bench
says ``go`` on stdin (``GatedLog``), so that every instance joins, the buckets are shared and every producer
is started before the measured window. It prints ``ready`` once it owns ``SHARE`` buckets (its fair share),
and ``done`` with a JSON object as soon as every bucket it owns reached ``HEAD``, its position saved: when
it got ``go`` and when it was done (both ``time.perf_counter()``, one clock for every process of the
machine), its CPU time (user + system, all its threads) between the two, and the events it published.

With ``BENCH_PROFILE=<file>`` the window runs under cProfile (everything on the event loop's thread, the reads
too, so the profile sees all of it) and its stats are written to ``<file>.<pid>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Mapping

from commitline.infrastructure.store.log import BucketLog, BucketPage
from commitline.infrastructure.store.recorder import EventRecorder


class GatedLog(BucketLog):
    """The bucket log, empty until ``go`` is set."""

    def __init__(self, recorder: EventRecorder, buckets: int, go: threading.Event):
        super().__init__(recorder, buckets)
        self.go = go

    def read(self, positions: Mapping[int, int], limit: int) -> BucketPage:
        if not self.go.is_set():
            return BucketPage([], [], min(positions.values()))
        return super().read(positions, limit)


def main(dsn: str, schema: str, bootstrap: str, prefix: str, share: int, head: int) -> None:
    from bench.harness import commitline_app

    go = threading.Event()
    marks: dict[str, float] = {}
    profile = os.environ.get("BENCH_PROFILE")
    profiler = None
    if profile:  # one thread: the reads and ``prepare`` run on the loop's thread too, under the profiler
        import cProfile

        async def inline(func, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            return func(*args, **kwargs)

        asyncio.to_thread = inline  # type: ignore[assignment]
        profiler = cProfile.Profile()
    with commitline_app(dsn, schema, kafka_bootstrap_servers=bootstrap, kafka_idempotence=False,
                        kafka_topic_prefix=prefix, pool_size=2, pool_max_overflow=4) as app:
        publisher = app.publisher()
        publisher.log = GatedLog(app.recorder, publisher.buckets, go)
        loop: dict[str, asyncio.AbstractEventLoop] = {}
        started = publisher.on_start

        async def on_start() -> None:
            loop["loop"] = asyncio.get_running_loop()
            await started()

        publisher.on_start = on_start  # type: ignore[method-assign]
        moved = publisher.moved

        trace = os.environ.get("BENCH_TRACE")

        def on_moved() -> None:
            moved()
            positions = publisher.positions
            if trace and go.is_set():
                print(f"{os.getpid()} {time.perf_counter() - marks['go']:.3f} {min(positions.values())}",
                      file=sys.stderr, flush=True)
            if go.is_set() and "done" not in marks and len(positions) == share and min(positions.values()) >= head:
                marks["done"], marks["cpu_done"] = time.perf_counter(), time.process_time()
                if profiler is not None:
                    profiler.disable()
                print("done", json.dumps({"go": marks["go"], "done": marks["done"],
                                          "cpu": marks["cpu_done"] - marks["cpu_go"],
                                          "published": publisher.metrics.events_published}), flush=True)

        publisher.moved = on_moved  # type: ignore[method-assign]

        def gate() -> None:
            while len(publisher.owned) != share or "loop" not in loop:
                time.sleep(0.005)
            print("ready", flush=True)
            if sys.stdin.readline().strip() != "go":
                raise SystemExit("the bench did not say go")
            marks["go"], marks["cpu_go"] = time.perf_counter(), time.process_time()
            go.set()

            def open_gate() -> None:
                if profiler is not None:
                    profiler.enable()
                publisher.wakeup.poke()

            loop["loop"].call_soon_threadsafe(open_gate)

        threading.Thread(target=gate, daemon=True).start()
        app.run_until_signalled(publisher, drain=True)
    if profiler is not None:
        profiler.dump_stats(f"{profile}.{os.getpid()}")
    if "done" not in marks:
        raise SystemExit("the publisher stopped before every bucket it owned reached the head")


if __name__ == "__main__":
    dsn_, schema_, bootstrap_, prefix_, share_, head_ = sys.argv[1:7]
    main(dsn_, schema_, bootstrap_, prefix_, int(share_), int(head_))
