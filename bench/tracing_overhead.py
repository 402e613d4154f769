"""What tracing costs a command: commitline's command throughput with tracing off (the default) and on.

``tracing``
    The ``throughput`` bench's workload (``receive_stock`` on its own ``InventoryItem`` per writer, a fresh
    idempotency key each, group commit on) at 1 and 32 writer threads, for 3 s after a 1 s warm-up
    (``--quick``: 1 s after 0.3 s), with tracing off and with tracing on: every command's dispatch, append
    and group-commit batch spans exported over OTLP/HTTP (the real exporter, its batch span processor)
    to a receiver in this process that reads each request and answers 200, as a collector on the same
    machine would; and on with 1 trace in 10 sampled (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``,
    ``OTEL_TRACES_SAMPLER_ARG=0.1``, which the SDK reads itself), as a busy service would run. Rounds
    alternate the order (off, on, sampled, sampled, on, off; ``--quick``: off, on, sampled); the best of
    each is reported, with ``ratio_on`` and ``ratio_sampled`` against off. Tracing off is the code path
    every other bench measures: compare ``off`` with their commitline figures.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.command_throughput import SNAPSHOT_INTERVAL, Measurement, drive
from bench.harness import BenchContext, commitline_app, fresh_schema

WRITERS = (1, 32)


class _Collector:
    """An OTLP/HTTP endpoint that takes every export and answers 200 (it counts requests and bytes only)."""

    def __init__(self) -> None:
        self.requests = self.bytes = 0
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                collector.requests += 1
                collector.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SAMPLED = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}


def _measure(ctx: BenchContext, schema: str, writers: int, warmup: float, duration: float, run: str,
             otlp: str | None, sampled: bool = False) -> Measurement:
    tracing = {}
    if otlp:  # a traces endpoint of its own per variant: each gets its own provider, built with the sampler asked for
        tracing = {"otel_exporter_otlp_traces_endpoint": f"{otlp}/{'sampled' if sampled else 'all'}/v1/traces"}
    saved = {name: os.environ.get(name) for name in SAMPLED}
    os.environ.update(SAMPLED if sampled else {})
    try:
        app = commitline_app(ctx.dsn, schema, snapshot_interval=SNAPSHOT_INTERVAL, **tracing)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    with app:
        assert (app.tracing is not None) == (otlp is not None)
        items = [str(app.dispatch({"type": "receive_stock", "item_id": f"00000000-0000-4000-8000-{i:012d}",
                                   "quantity": 1}, idempotency_key=f"{run}-create-{i}").aggregate_id)
                 for i in range(writers)]

        def command(i: int, seq: int) -> None:
            app.dispatch({"type": "receive_stock", "item_id": items[i], "quantity": 1},
                         idempotency_key=f"{run}-{i}-{seq}")

        return drive(writers, command, warmup, duration, None)


def tracing(ctx: BenchContext) -> Iterator[str]:
    warmup, duration = (0.3, 1.0) if ctx.quick else (1.0, 3.0)
    order = ("off", "on", "sampled") if ctx.quick else ("off", "on", "sampled", "sampled", "on", "off")
    collector = _Collector()
    try:
        with fresh_schema(ctx.dsn) as schema:
            for writers in WRITERS:
                best: dict[str, Measurement] = {}
                for n, variant in enumerate(order):
                    m = _measure(ctx, schema, writers, warmup, duration, f"w{writers}r{n}",
                                 None if variant == "off" else collector.endpoint, sampled=variant == "sampled")
                    if variant not in best or m.rate > best[variant].rate:
                        best[variant] = m
                off, on, sampled = best["off"], best["on"], best["sampled"]
                yield (f"tracing writers={writers}: off={off.rate:.0f} on={on.rate:.0f} sampled={sampled.rate:.0f} "
                       f"commands/s ratio_on={on.rate / off.rate:.2f} ratio_sampled={sampled.rate / off.rate:.2f} "
                       f"p50 off={off.percentile(0.5) * 1000:.1f}ms on={on.percentile(0.5) * 1000:.1f}ms "
                       f"sampled={sampled.percentile(0.5) * 1000:.1f}ms")
        yield f"tracing: the collector received {collector.requests} exports, {collector.bytes} bytes"
    finally:
        collector.close()


BENCHMARKS = (("tracing", tracing),)
