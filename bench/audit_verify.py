"""Audit verification: events/s of ``Auditor.verify()`` over a 200,000-event store, against a
read-only pass over the same rows in the same run.

``audit_verify``: the log is pre-filled like ``projection_rebuild``'s (valid events of every
kind, written straight through ``recorder.append``, which chains each stream's hashes), then
ANALYZEd. Baseline ``read_only``: the verifier's own read (``PostgresAuditSource.chain_records``,
a server-side cursor in pages of 10,000, ordered by stream and version) with nothing done per
row. Measured: ``Auditor.verify()`` of every stream (the same read, plus re-deriving every
hash and link, plus the idempotency witnesses). Each is run twice (``--quick``: once); the
best is reported, with the ratio verify / read_only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from bench.harness import BenchContext, commitline_app, fresh_schema
from bench.projection_rebuild import prefill
from commitline.infrastructure.store.audit_source import PostgresAuditSource


def audit_verify(ctx: BenchContext) -> Iterator[str]:
    total = 40_000 if ctx.quick else 200_000
    rounds = 1 if ctx.quick else 2
    with fresh_schema(ctx.dsn) as schema, commitline_app(ctx.dsn, schema) as app:
        prefill(app.recorder, total)
        with app.datastore.get_connection() as conn:
            conn.execute(f'ANALYZE "{schema}".events')
        source = PostgresAuditSource(app.recorder, app.codec)
        read_only = verify = 0.0
        report = None
        for _ in range(rounds):
            started = time.perf_counter()
            rows = sum(1 for _ in source.chain_records(None))
            read_only = max(read_only, rows / (time.perf_counter() - started))
            report = app.auditor().verify()
            verify = max(verify, report.events / report.seconds)
        assert report is not None and report.ok and report.events == rows == total, report
        yield (f"audit verify: {verify:,.0f} events/s ({report.events} events, {report.streams} streams, "
               f"all OK) read_only={read_only:,.0f} events/s ratio={verify / read_only:.2f}")


BENCHMARKS = (("audit_verify", audit_verify),)
