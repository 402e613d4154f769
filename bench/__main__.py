"""``python -m bench`` (``make bench``): run the benchmarks, one line per figure.

Measures nothing itself; each benchmark module says what it measures and against which
baseline (always measured in the same run, on the same database). The database is
``COMMITLINE_BENCH_DSN`` if set, else an embedded PostgreSQL (fsync on) in a temporary folder;
every benchmark works in its own schema, dropped at the end.

    python -m bench                      # everything (15-18 minutes on 2 cores)
    python -m bench --quick              # shorter windows, smaller stores, fewer rounds (~1 min)
    python -m bench contention           # only the named benchmarks (or modules)
    python -m bench --list
    python -m bench scale                # cost as the log grows (``make bench-scale``; never run by default)

Adding a benchmark: a module ``bench/<name>.py`` with a docstring (what, against which
baseline) and ``BENCHMARKS = (("name", callable), ...)``, each callable taking a
:class:`bench.harness.BenchContext` and yielding printed lines; then list the module in
``MODULES`` below.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType

from bench import (
    audit_verify,
    cold_cache,
    command_throughput,
    cpu_per_command,
    eventsourcing_module,
    http_api,
    personal_data,
    projection_rebuild,
    publisher_throughput,
    scale,
    tracing_overhead,
)
from bench.harness import BenchContext, open_database

#: Benchmark modules, in running order.
MODULES: list[ModuleType] = [command_throughput, cpu_per_command, cold_cache, http_api, eventsourcing_module, publisher_throughput,
                             projection_rebuild, audit_verify, tracing_overhead, personal_data, scale]

#: Benchmarks run only when named: the scale bench fills millions of events (``make bench-scale``).
EXPLICIT = {"scale"}

Benchmark = tuple[str, str, Callable[[BenchContext], Iterator[str]]]  # (name, module, callable)


def all_benchmarks() -> list[Benchmark]:
    return [(name, module.__name__.rsplit(".", 1)[-1], func) for module in MODULES for name, func in module.BENCHMARKS]


def main(argv: list[str] | None = None) -> int:
    benchmarks = all_benchmarks()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks or modules to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="shorter measurement windows, one round")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name, module, _ in benchmarks:
            print(f"{name}  (bench/{module}.py)" + ("  [only when named: make bench-scale]" if name in EXPLICIT else ""))
        return 0
    known = {n for n, _, _ in benchmarks} | {m for _, m, _ in benchmarks}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    selected = [b for b in benchmarks if b[0] in args.names or b[1] in args.names
                or (not args.names and b[0] not in EXPLICIT)]

    started = time.perf_counter()
    failed = 0
    with open_database() as (dsn, description):
        print(f"# database: {description}", flush=True)
        ctx = BenchContext(dsn=dsn, quick=args.quick)
        for name, _, func in selected:
            t0 = time.perf_counter()
            try:
                for line in func(ctx):
                    print(line, flush=True)
            except Exception:
                failed += 1
                print(f"{name}: FAILED", flush=True)
                traceback.print_exc()
            print(f"# {name} took {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"# total {time.perf_counter() - started:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
