"""Cost as the log grows: the same figures on an empty store and on one holding millions of events.

``make bench-scale`` (``python -m bench scale``; not part of ``make bench``).
Size: ``COMMITLINE_BENCH_SCALE_EVENTS`` events (default 10,000,000), written by ``bench.scale_fill`` (the
examples' survey and inventory streams over 100 tenants, real hash chains, and the idempotency record with its
stored outcome that each event's command left). One schema, filled in steps, the baseline being the same store
before it grew:

1. empty store: a long aggregate made by ``LONG`` (10,000) real ``receive_stock`` commands on one item
   (snapshots every 10 events, the default), then commands/s and p99 at 32 writers
   (``command_throughput.measure_commitline``: fresh items, one per writer, best of the rounds and of the two
   thread placements), then the long aggregate's cold load (an app whose aggregate cache is off, so every load
   reads its latest snapshot and the events after it; the median of ``LOADS`` loads on connections that met the
   statement before, as a running server's have, the first ``LOADS`` printed apart; PostgreSQL's buffers stay warm);
2. the log filled to ``REFERENCE`` (200,000) events, ANALYZEd (as autovacuum would), and a new follower's
   catch-up read from position 0: a freshly opened app in a new process reading ``select_notifications``
   pages of 5,000 and decoding every event (``projection_rebuild.read_pass``, the rebuild's read path): the
   200,000-event figure;
3. the log filled to the size asked (timed: the prefill figure), ANALYZEd, and the same three figures again.

Goals (the issue's): commands/s at 32 writers >= 0.9x the empty store's, p99 <= 1.2x, catch-up read >= 0.9x the
200,000-event figure, long aggregate load <= 1.2x. Then bytes on disk per event: every table of the schema
(heap with its TOAST, and indexes apart), beside the stock ``eventsourcing`` ``PostgresApplicationRecorder``'s
table holding the same stored events (the first ``STOCK_SAMPLE`` of them, 1,000,000 at most: B-tree and heap
sizes grow linearly, so per event the sample stands for the whole), and what grows without bound: the events
with their indexes, and the idempotency records, which ``commitline idempotency expire`` can delete.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import psycopg
from psycopg.sql import SQL, Identifier

from bench.command_throughput import Measurement, measure_commitline, placements
from bench.harness import BenchContext, commitline_app, fresh_schema
from bench.projection_rebuild import read_pass
from bench.scale_fill import Filler, stock_recorder
from commitline.examples.inventory import InventoryItem

SIZE_VARIABLE = "COMMITLINE_BENCH_SCALE_EVENTS"
DEFAULT_EVENTS = 10_000_000
REFERENCE = 200_000  # the log length of the catch-up read's baseline
LONG = 10_000  # events of the long aggregate
LOADS = 21  # cold loads of it, the median reported
WRITERS = 32
STOCK_SAMPLE = 1_000_000
GOALS = {"commands": 0.9, "p99": 1.2, "catch_up": 0.9, "load": 1.2}


def scale_events() -> int:
    raw = os.environ.get(SIZE_VARIABLE, "").strip() or str(DEFAULT_EVENTS)
    try:
        events = int(raw.replace("_", ""))
    except ValueError:
        raise SystemExit(f"{SIZE_VARIABLE} must be a whole number of events, not {raw!r}") from None
    if events <= REFERENCE:
        raise SystemExit(f"{SIZE_VARIABLE} must be above {REFERENCE:,} (the catch-up read's baseline), not {events:,}")
    return events


def commands(ctx: BenchContext, schema: str) -> Measurement:
    """commitline at 32 writers: the best of the rounds and placements."""
    warmup, duration, rounds = (0.3, 1.0, 1) if ctx.quick else (1.0, 3.0, 2)
    best: Measurement | None = None
    for r in range(rounds):
        for cpu in placements() if r % 2 == 0 else placements()[::-1]:
            m = measure_commitline(ctx, schema, WRITERS, warmup, duration, cpu)
            best = m if best is None or m.rate > best.rate else best
    assert best is not None
    return best


def make_long(ctx: BenchContext, schema: str) -> uuid.UUID:
    item = uuid.uuid4()
    with commitline_app(ctx.dsn, schema) as app:
        for n in range(LONG):
            app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1}, idempotency_key=f"long-{n}")
    return item


def cold_load(ctx: BenchContext, schema: str, item: uuid.UUID) -> tuple[float, float]:
    """Median seconds of loading the long item with the aggregate cache off (snapshot + the events after it):
    (on connections that met the statement before, the first ``LOADS`` on a freshly opened app's connections).

    The pool hands its connections out in turn, and a connection's first statements on a server process pay
    that process's catalog caches and the statement's preparation (1-5 ms on the shared machine, more than the
    load itself): a running server's connections have paid it long before, so the goal reads the second figure
    set, ``LOADS`` more; the first is printed beside it."""
    first, times = [], []
    with commitline_app(ctx.dsn, schema, aggregate_cache_size=0) as app:
        for timed in (first, times):
            for _ in range(LOADS):
                t0 = time.perf_counter()
                loaded = app.store.load(InventoryItem, item, tenant="default")
                timed.append(time.perf_counter() - t0)
                if loaded.version < LONG:
                    raise RuntimeError(f"the long aggregate loaded at version {loaded.version}, expected {LONG}")
    return statistics.median(times), statistics.median(first)


def catch_up(ctx: BenchContext, schema: str) -> tuple[int, float]:
    """(events, events/s) of a new follower reading the whole log, the best of the rounds. Each round reads in
    a new process, as a follower that joins does: the bench's own process has filled the store, and a reader
    sharing its heap decodes more slowly (``docs/benchmarks.md``, "Cost as the log grows")."""
    best: tuple[int, float] = (0, 0.0)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        for _ in range(1 if ctx.quick else 2):
            n, seconds = pool.submit(read_whole_log, ctx.dsn, schema).result()
            best = max(best, (n, n / seconds), key=lambda b: b[1])
    return best


def read_whole_log(dsn: str, schema: str) -> tuple[int, float]:
    """(events, seconds) of a freshly opened app reading and decoding the log up to its head."""
    with commitline_app(dsn, schema) as app:
        head = app.recorder.max_notification_id() or 0
        return read_pass(app.recorder, head, decode=True)


def events_size(ctx: BenchContext, schema: str) -> tuple[float, str]:
    """(MiB of the events table with its indexes, the server's shared_buffers)."""
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        size = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (f'"{schema}".events',)).fetchone()[0]  # type: ignore[index]
        buffers = conn.execute("SHOW shared_buffers").fetchone()[0]  # type: ignore[index]
    return size / 2**20, str(buffers)


def analyze(ctx: BenchContext, schema: str) -> None:
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        for table in ("events", "idempotency_keys", "snapshots"):
            conn.execute(SQL("ANALYZE {}").format(Identifier(schema, table)))


def fill_to(ctx: BenchContext, schema: str, filler: Filler, target: int) -> float:
    """Seconds to fill the log up to ``target`` events (counting what commands wrote)."""
    with psycopg.connect(ctx.dsn) as conn:
        head = conn.execute(SQL("SELECT coalesce(max(notification_id), 0) FROM {}").format(
            Identifier(schema, "events"))).fetchone()[0]  # type: ignore[index]
    t0 = time.perf_counter()
    filler.fill(filler.written + max(0, target - head))
    seconds = time.perf_counter() - t0
    analyze(ctx, schema)
    return seconds


def sizes(ctx: BenchContext, schema: str) -> dict[str, tuple[int, int, int]]:
    """table -> (rows, heap bytes with TOAST, index bytes) of every table of ``schema``."""
    out = {}
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        tables = conn.execute("SELECT c.oid, c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid) FROM pg_class c "
                              "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                              (schema,)).fetchall()
        for _, name, heap, index in tables:
            rows = conn.execute(SQL("SELECT count(*) FROM {}").format(Identifier(schema, name))).fetchone()[0]  # type: ignore[index]
            out[name] = (rows, heap, index)
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def verdict(value: float, goal: float, at_least: bool) -> str:
    met = value >= goal if at_least else value <= goal
    return f"goal {'>=' if at_least else '<='} {goal}x: {'met' if met else 'MISSED'}"


def per_event(rows_heap_index: tuple[int, int, int], events: int) -> str:
    rows, heap, index = rows_heap_index
    return f"table={heap / events:.0f} indexes={index / events:.0f} total={(heap + index) / events:.0f} B ({rows:,} rows)"


def scale(ctx: BenchContext) -> Iterator[str]:
    total = scale_events()
    with fresh_schema(ctx.dsn, "benchscale") as schema, fresh_schema(ctx.dsn, "benchstock") as stock_schema:
        t0 = time.perf_counter()
        item = make_long(ctx, schema)
        yield f"scale setup: long aggregate of {LONG:,} receive_stock commands in {time.perf_counter() - t0:.1f} s"
        empty_cmd = commands(ctx, schema)
        empty_load, empty_first = cold_load(ctx, schema, item)
        yield (f"scale empty store: commands/s={empty_cmd.rate:.0f} p99={empty_cmd.percentile(0.99) * 1000:.1f}ms "
               f"long aggregate cold load={empty_load * 1000:.1f}ms")
        with commitline_app(ctx.dsn, schema) as app:
            filler = Filler(app, stock_recorder(app, stock_schema), min(total, STOCK_SAMPLE))
            fill_s = fill_to(ctx, schema, filler, REFERENCE)
            ref_n, ref_rate = catch_up(ctx, schema)
            ref_mib, buffers = events_size(ctx, schema)
            yield f"scale reference: catch-up read of {ref_n:,} events {ref_rate:.0f} events/s; filling to {total:,}"
            fill_s += fill_to(ctx, schema, filler, total)
            filler.stock.datastore.close()  # type: ignore[union-attr]
        stored_cmd = commands(ctx, schema)
        stored_load, stored_first = cold_load(ctx, schema, item)
        read_n, read_rate = catch_up(ctx, schema)
        read_mib, _ = events_size(ctx, schema)
        ours, stock = sizes(ctx, schema), sizes(ctx, stock_schema)

    events = read_n
    r_cmd, r_p99 = ratio(stored_cmd.rate, empty_cmd.rate), ratio(stored_cmd.percentile(0.99), empty_cmd.percentile(0.99))
    r_read, r_load = ratio(read_rate, ref_rate), ratio(stored_load, empty_load)
    yield (f"scale commands/s writers={WRITERS}: empty={empty_cmd.rate:.0f} stored={stored_cmd.rate:.0f} "
           f"events={events} ratio={r_cmd:.2f}")
    yield (f"scale goals: commands/s stored/empty={r_cmd:.2f} ({verdict(r_cmd, GOALS['commands'], True)}); "
           f"p99 writers={WRITERS} empty={empty_cmd.percentile(0.99) * 1000:.1f}ms "
           f"stored={stored_cmd.percentile(0.99) * 1000:.1f}ms ratio={r_p99:.2f} ({verdict(r_p99, GOALS['p99'], False)}); "
           f"catch-up read {ref_n:,} events={ref_rate:.0f}/s {events:,} events={read_rate:.0f}/s ratio={r_read:.2f} "
           f"({verdict(r_read, GOALS['catch_up'], True)}); long aggregate ({LONG:,} events, snapshots on) cold load "
           f"empty={empty_load * 1000:.1f}ms stored={stored_load * 1000:.1f}ms ratio={r_load:.2f} "
           f"({verdict(r_load, GOALS['load'], False)})")
    yield (f"scale long aggregate load on new connections (not a goal: each pooled connection's first statements, "
           f"which a running server paid long before): empty={empty_first * 1000:.1f}ms "
           f"stored={stored_first * 1000:.1f}ms ratio={ratio(stored_first, empty_first):.2f}")
    yield (f"scale catch-up read: a fresh app in a new process, select_notifications pages of 5,000 + decode, "
           f"best of the rounds; "
           f"events table with its indexes {ref_mib:.0f} MiB at {ref_n:,} events, {read_mib:.0f} MiB at {events:,}; "
           f"the server's shared_buffers {buffers} (beyond it pages come from the OS cache or the disk)")
    if empty_cmd.errors or stored_cmd.errors:
        yield f"scale errors: empty {empty_cmd.errors}, stored {stored_cmd.errors} failed commands"
    prefilled = filler.written
    yield (f"scale prefill: {prefilled:,} events with their idempotency records in {fill_s:.1f} s "
           f"({prefilled / fill_s:.0f} events/s, {filler.stock_written:,} of them also into the stock table)")
    yield from bytes_lines(ours, stock, events, filler.stock_written)
    if total < DEFAULT_EVENTS:
        yield extrapolation(ours, stock, events, filler.stock_written)


def bytes_lines(ours: dict[str, tuple[int, int, int]], stock: dict[str, tuple[int, int, int]], events: int,
                stock_events: int) -> Iterator[str]:
    grand = sum(h + i for _, h, i in ours.values())
    yield f"scale bytes/event: all tables {grand / events:.0f} B over {events:,} events"
    for name in ("events", "idempotency_keys", "snapshots"):
        if name in ours:
            share = (ours[name][1] + ours[name][2]) / grand
            yield f"scale bytes/event {name}: {per_event(ours[name], events)}, {share:.0%} of the store"
    stock_table = stock.get("stored_events")
    if stock_table is not None and stock_events:
        ev = ours["events"]
        yield (f"scale bytes/event stock eventsourcing stored_events (the same stored events, first "
               f"{stock_events:,}): {per_event(stock_table, stock_events)}; commitline events/stock="
               f"{ratio((ev[1] + ev[2]) / events, sum(stock_table[1:]) / stock_events):.2f} (events table and "
               f"indexes only: hash chain, txid, tenant in the row); with the idempotency records "
               f"{ratio(grand / events, sum(stock_table[1:]) / stock_events):.2f}")
    idem = ours.get("idempotency_keys", (0, 0, 0))
    yield (f"scale growth: the events and their two indexes (primary key, notification id) grow with the log and "
           f"are kept; the idempotency records ({(idem[1] + idem[2]) / grand:.0%} of the store, "
           f"{(idem[1] + idem[2]) / max(1, idem[0]):.0f} B each) only need to outlive clients' retries: "
           f"run `commitline idempotency expire --older-than-days D` daily with D above the longest retry window "
           f"(e.g. 7); snapshots are one per stream of 10 events or more, its latest")


def extrapolation(ours: dict[str, tuple[int, int, int]], stock: dict[str, tuple[int, int, int]], events: int,
                  stock_events: int) -> str:
    """The sizes at the issue's 10,000,000 events from these bytes per event (linear); nothing else is."""
    def at_default(heap_index: int, n: int) -> str:
        return f"{heap_index / n * DEFAULT_EVENTS / 1e9:.1f} GB"

    grand = sum(h + i for _, h, i in ours.values())
    parts = [f"{name} {at_default(ours[name][1] + ours[name][2], events)}"
             for name in ("events", "idempotency_keys") if name in ours]
    stock_part = (f", the stock table {at_default(sum(stock['stored_events'][1:]), stock_events)}"
                  if "stored_events" in stock and stock_events else "")
    return (f"scale extrapolation: measured at {events:,} events, below {DEFAULT_EVENTS:,}; at {DEFAULT_EVENTS:,} "
            f"the same bytes per event make {at_default(grand, events)} ({', '.join(parts)}){stock_part}. Only sizes "
            f"extrapolate linearly: the commands/s, p99, catch-up and load ratios depend on what still fits in "
            f"the server's cache and are not extrapolated")


#: What ``python -m bench scale`` runs (``make bench`` leaves it out: see ``bench.__main__.EXPLICIT``).
BENCHMARKS = (("scale", scale),)
