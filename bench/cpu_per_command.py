"""The command path's own cost: microseconds of CPU per command, and context switches per command.

``cpu_per_command``
    1 and 32 writer threads each loop ``receive_stock`` on their own item (the ``throughput`` bench's
    command, snapshots at commitline's default interval) through a fixed window after a warm-up; printed per
    writer count:
    this process's CPU time (user and system, every thread: the dispatching threads, the group commit's
    batches, libpq) divided by the commands completed in the window, and the voluntary and involuntary
    context switches per command (``getrusage``). The PostgreSQL server's CPU is not counted. There is no
    other system to compare with: the figure is compared with itself across commits (issue 28 asks for it
    before and after), and it is steadier than commands/s on a shared machine, though load from other
    processes still raises it (colder caches, more switches).
"""

from __future__ import annotations

import itertools
import resource
import threading
import time
import uuid
from collections.abc import Iterator

from bench.command_throughput import SNAPSHOT_INTERVAL
from bench.harness import BenchContext, commitline_app, fresh_schema

WRITER_COUNTS = (1, 32)


def measure(ctx: BenchContext, writers: int) -> str:
    warmup, duration = (1.0, 3.0) if ctx.quick else (2.0, 8.0)
    with fresh_schema(ctx.dsn) as schema, commitline_app(ctx.dsn, schema, snapshot_interval=SNAPSHOT_INTERVAL) as app:
        run = uuid.uuid4().hex[:8]
        items = [str(app.dispatch({"type": "receive_stock", "item_id": str(uuid.uuid4()), "quantity": 1},
                                  idempotency_key=f"{run}-create-{i}").aggregate_id) for i in range(writers)]
        phase = ["warm-up"]
        counted = [0] * writers
        errors: list[BaseException] = []
        start = threading.Barrier(writers + 1)

        def loop(i: int) -> None:
            start.wait()
            try:
                for seq in itertools.count():
                    now = phase[0]
                    if now == "over":
                        return
                    app.dispatch({"type": "receive_stock", "item_id": items[i], "quantity": 1},
                                 idempotency_key=f"{run}-{i}-{seq}")
                    if now == "window":
                        counted[i] += 1
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(writers)]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(warmup)
        before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        phase[0] = "window"
        time.sleep(duration)
        phase[0] = "over"
        after, ended = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for t in threads:
            t.join(120)
    if errors:
        raise errors[0]
    n = max(1, sum(counted))
    user, system = (after.ru_utime - before.ru_utime) / n * 1e6, (after.ru_stime - before.ru_stime) / n * 1e6
    return (f"cpu per command writers={writers}: us={user + system:.1f} user_us={user:.1f} system_us={system:.1f} "
            f"voluntary_switches={(after.ru_nvcsw - before.ru_nvcsw) / n:.2f} "
            f"involuntary_switches={(after.ru_nivcsw - before.ru_nivcsw) / n:.2f} "
            f"commands/s={sum(counted) / (ended - began):.0f}")


def cpu_per_command(ctx: BenchContext) -> Iterator[str]:
    for writers in WRITER_COUNTS:
        yield measure(ctx, writers)
    yield "# cpu per command: this process's CPU (every thread, not the server's) per receive_stock command"


BENCHMARKS = (("cpu_per_command", cpu_per_command),)
