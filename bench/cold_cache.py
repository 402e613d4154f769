"""Commands on existing streams this process has not cached, beside the cached figure.

``cold_cache``
    ``throughput``'s commitline figure gives every writer an item of its own, created at the start of the
    measurement: after its first command every write finds the item in the aggregate cache and reads nothing.
    Here the streams exist before the process starts: ``STREAMS`` inventory items (``--quick``: 2,000) of
    ``LENGTH`` (30) to ``LENGTH + 9`` ``StockReceived`` events each (as many of each length), written through
    ``recorder.append`` with real hash chains, version by version over all items (a stream's events lie among
    the others'), with the snapshots their commands would have left at commitline's default interval (10): one
    at each multiple of it, made from the item's own state at that version. So a stream's latest snapshot is 0
    to 9 events behind its head, as in a store written by commands. 32 writers each loop ``receive_stock`` on an
    item drawn at random among them (unique idempotency keys) from an app with the default snapshot interval
    whose aggregate cache is off (``COMMITLINE_AGGREGATE_CACHE_SIZE=0``), so every command reads its key, the
    stream's latest snapshot and the events after it, and replays them before it decides, as a process meeting
    those streams for the first time would.

    Baseline, same run, same schema and windows: ``command_throughput.measure_commitline`` at 32 writers (the
    cached figure). Both are measured with the writer threads free and all on one CPU, the better kept, the
    order alternating per round; best of two rounds (``--quick``: one). The ratio reads cold / cached.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator

from eventsourcing.persistence import StoredEvent

from bench.command_throughput import SNAPSHOT_INTERVAL, measure_commitline, placements
from bench.driving import Measurement, drive
from bench.harness import BenchContext, commitline_app, fresh_schema
from commitline.application.chain import GENESIS, chain
from commitline.examples.inventory import InventoryItem
from commitline.infrastructure.store.codec import encode_event, encode_snapshot
from commitline.infrastructure.store.snapshot_shape import shape_of, stored_type
from commitline.infrastructure.store.streams import Snapshot

WRITERS = 32
LENGTH = 30
CHUNK = 5_000


def prefill(ctx: BenchContext, schema: str, streams: int) -> list[str]:
    """``streams`` items of ``LENGTH`` to ``LENGTH + 9`` events each (version by version over all items) and
    their snapshots every ``SNAPSHOT_INTERVAL`` events; their ids."""
    ids = [uuid.uuid4() for _ in range(streams)]
    lengths = [LENGTH + n % 10 for n in range(streams)]
    items: list[InventoryItem | None] = [None] * streams
    heads = [GENESIS] * streams
    events: list[StoredEvent] = []
    links: list[tuple[bytes, bytes]] = []
    snapshots: list[Snapshot] = []
    snapshot_type = stored_type("InventoryItem", shape_of(InventoryItem))  # as the store takes them: used
    with commitline_app(ctx.dsn, schema) as app:
        def write(last: bool) -> None:
            save = len(snapshots) >= CHUNK or (last and snapshots)
            if len(events) >= CHUNK or ((last or save) and events):  # a snapshot is stored after its event
                app.recorder.append(events, links=links)
                events.clear()
                links.clear()
            if save:
                app.recorder.save_snapshots(snapshots)
                snapshots.clear()

        for version in range(1, max(lengths) + 1):
            for n in range(streams):
                if lengths[n] < version:
                    continue
                item = items[n] = InventoryItem.receive_new(ids[n], 1) if version == 1 else items[n]
                assert item is not None
                if version > 1:
                    item.receive(1)
                (event,) = item.collect_events()
                events.append(encode_event(event, "default"))
                links.append(chain(heads[n], events[-1:])[0])
                heads[n] = links[-1][1]
                if version % SNAPSHOT_INTERVAL == 0:
                    snapshots.append(Snapshot(ids[n], version, snapshot_type, encode_snapshot(item), heads[n]))
                write(False)
        write(True)
    return [str(i) for i in ids]


def measure_cold(items: list[str]) -> Callable[[BenchContext, str, int, float, float, int | None], Measurement]:
    def run(ctx: BenchContext, schema: str, writers: int, warmup: float, duration: float,
            cpu: int | None = None) -> Measurement:
        tag = uuid.uuid4().hex[:8]
        draws = [random.Random(f"{tag}-{i}") for i in range(writers)]
        with commitline_app(ctx.dsn, schema, dispatch_cpu="off", aggregate_cache_size=0) as app:
            def command(i: int, seq: int) -> None:
                app.dispatch({"type": "receive_stock", "item_id": draws[i].choice(items), "quantity": 1},
                             idempotency_key=f"{tag}-{i}-{seq}")

            return drive(writers, command, warmup, duration, cpu)

    return run


def cold_cache(ctx: BenchContext) -> Iterator[str]:
    warmup, duration, rounds = (0.3, 1.0, 1) if ctx.quick else (1.0, 3.0, 2)
    streams = 2_000 if ctx.quick else 10_000
    with fresh_schema(ctx.dsn) as schema:
        items = prefill(ctx, schema, streams)
        systems = {"cold_cache": measure_cold(items), "cached": measure_commitline}
        best: dict[str, Measurement] = {}
        placed: dict[str, int | None] = {}
        for r in range(rounds):
            for name in list(systems) if r % 2 == 0 else list(systems)[::-1]:
                for cpu in placements() if r % 2 == 0 else placements()[::-1]:
                    m = systems[name](ctx, schema, WRITERS, warmup, duration, cpu)
                    if name not in best or m.rate > best[name].rate:
                        best[name], placed[name] = m, cpu
    cold, cached = best["cold_cache"], best["cached"]
    ratio = cold.rate / cached.rate if cached.rate else float("inf")
    yield (f"commands/s writers={WRITERS} existing streams: cold_cache={cold.rate:.0f} cached={cached.rate:.0f} "
           f"ratio={ratio:.2f} (reads cold_cache / cached: random streams among {streams:,} of {LENGTH}-{LENGTH + 9} "
           f"events with snapshots every {SNAPSHOT_INTERVAL}, aggregate cache off, vs one cached item per writer)")
    yield (f"latency writers={WRITERS} existing streams: " + "; ".join(
        f"{name} p50={m.percentile(0.5) * 1000:.1f}ms p99={m.percentile(0.99) * 1000:.1f}ms "
        f"placement={'free' if placed[name] is None else f'cpu{placed[name]}'}" for name, m in best.items()))
    for name, m in best.items():
        if m.errors:
            yield (f"errors writers={WRITERS} existing streams: {name} {m.errors} failed commands, first: "
                   f"{type(m.first_error).__name__}: {m.first_error}")


#: What ``python -m bench`` runs from this module: (name, callable).
BENCHMARKS = (("cold_cache", cold_cache),)
