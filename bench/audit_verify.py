"""Audit verification: events/s of ``Auditor.verify()`` over a 200,000-event store, against a
read-only pass over the same rows in the same run.

``audit_verify``: the log is pre-filled like ``projection_rebuild``'s (valid events of every
kind, written straight through ``recorder.append``, which chains each stream's hashes), then
ANALYZEd. Baseline ``read_only``: the verifier's own read (``PostgresAuditSource.chain_records``:
the same query, a server-side cursor in pages of 10,000, ordered by stream and version) with
nothing done per row. Measured: ``Auditor.verify()`` of every stream (the same read, plus
re-deriving every hash and link, plus the idempotency witnesses). Three rounds (``--quick`` too,
on a smaller store), each a read-only pass then a verification; the figure is the median of
the three, and the ratio the median of the per-round ratios verify / read_only.
Target: ratio >= 0.8.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

from bench.harness import BenchContext, commitline_app, fresh_schema
from bench.projection_rebuild import prefill
from commitline.infrastructure.store.audit_source import PostgresAuditSource

ROUNDS = 3
TARGET_RATIO = 0.8


def audit_verify(ctx: BenchContext) -> Iterator[str]:
    total = 40_000 if ctx.quick else 200_000
    with fresh_schema(ctx.dsn) as schema, commitline_app(ctx.dsn, schema) as app:
        prefill(app.recorder, total)
        with app.datastore.get_connection() as conn:
            conn.execute(f'ANALYZE "{schema}".events')
        source = PostgresAuditSource(app.recorder, app.codec)
        read_only: list[float] = []
        verify: list[float] = []
        report = None
        for _ in range(ROUNDS):
            started = time.perf_counter()
            rows = sum(len(page) for page in source.chain_pages(None))
            read_only.append(rows / (time.perf_counter() - started))
            started = time.perf_counter()
            report = app.auditor().verify()
            verify.append(report.events / (time.perf_counter() - started))
            assert report.ok and report.events == rows == total, report
        assert report is not None
        ratio = statistics.median([v / r for v, r in zip(verify, read_only)])
        yield (f"audit verify: {statistics.median(verify):,.0f} events/s ({report.events} events, {report.streams} "
               f"streams, all OK; median of {ROUNDS}) read_only={statistics.median(read_only):,.0f} events/s "
               f"ratio={ratio:.2f} (per round {', '.join(f'{v / r:.2f}' for v, r in zip(verify, read_only))}) "
               f"[goal reads ratio: verify / the read-only pass of the same round, median of {ROUNDS}: "
               f">= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'MISSED'}]")


BENCHMARKS = (("audit_verify", audit_verify),)
