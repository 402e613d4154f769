"""The same ``eventsourcing`` Application on commitline's persistence module vs the stock one.

``eventsourcing_module``
    commands/s with 1, 4, 16 and 32 concurrent writers on distinct aggregates, for the bench's
    ``Item`` application (``bench.command_throughput``: ``item = app.repository.get(id);
    item.receive(1); app.save(item)``, a snapshot every 100 events) run twice in the same run,
    against the same server, with the same pool (8 + 40 overflow) and windows: once with
    ``PERSISTENCE_MODULE=commitline.eventsourcing`` (lock-free appends, gap-safe log, hash
    chains) and once with ``PERSISTENCE_MODULE=eventsourcing.postgres`` (the stock recorder,
    ``LOCK TABLE ... EXCLUSIVE`` on every append): the baseline. Only the environment differs.
    Measurements alternate stock/commitline then commitline/stock (ABBA against drift); the best
    of the rounds is reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from bench.command_throughput import WRITER_COUNTS, Measurement, StockApp, measure_stock
from bench.harness import BenchContext, fresh_schema


class ModuleApp(StockApp):
    name = "BenchModule"  # its own tables beside the stock app's: <schema>.benchmodule_events, ..._snapshots


def measure(app_class: type[StockApp], module: str) -> Callable[[BenchContext, str, int, float, float], Measurement]:
    def run(ctx: BenchContext, schema: str, writers: int, warmup: float, duration: float) -> Measurement:
        return measure_stock(ctx, schema, writers, warmup, duration, app_class=app_class, module=module)

    return run


def eventsourcing_module(ctx: BenchContext) -> Iterator[str]:
    warmup, duration, rounds = (0.3, 1.0, 1) if ctx.quick else (1.0, 3.0, 2)
    systems = {"stock": measure(StockApp, "eventsourcing.postgres"),
               "commitline": measure(ModuleApp, "commitline.eventsourcing")}
    with fresh_schema(ctx.dsn) as schema:
        for writers in WRITER_COUNTS:
            best: dict[str, Measurement] = {}
            for r in range(rounds):
                for name in ("stock", "commitline") if r % 2 == 0 else ("commitline", "stock"):
                    m = systems[name](ctx, schema, writers, warmup, duration)
                    if name not in best or m.rate > best[name].rate:
                        best[name] = m
            ours, stock = best["commitline"], best["stock"]
            ratio = ours.rate / stock.rate if stock.rate else float("inf")
            yield (f"eventsourcing module commands/s writers={writers}: commitline={ours.rate:.0f} "
                   f"stock={stock.rate:.0f} ratio={ratio:.2f}")
            for name, m in best.items():
                if m.errors:
                    yield (f"eventsourcing module errors writers={writers}: {name} {m.errors} failed commands, "
                           f"first: {type(m.first_error).__name__}: {m.first_error}")


#: What ``python -m bench`` runs from this module: (name, callable).
BENCHMARKS = (("eventsourcing_module", eventsourcing_module),)
