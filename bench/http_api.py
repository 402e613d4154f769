"""The HTTP command API (``commitline serve`` as a real subprocess, over TCP): its safety under contention
and its commands/s beside in-process ``dispatch``.

``http_contention``
    The ``contention`` benchmark over HTTP: a payment is created and submitted (version 2), then 50
    threads released together by a barrier each POST ``complete_payment`` (odd) or ``fail_payment``
    (even) with ``expected_version=2`` and its own ``Idempotency-Key`` to ``commitline serve --workers 2``.
    The baseline is the invariant itself: ``ok=1 conflict=49 other=0`` (200, 409
    ``concurrency_conflict``, anything else).

``http_throughput``
    Commands/s of ``commitline serve --no-access-log`` (one worker process: its default, and on this 2-core
    machine, shared with PostgreSQL and the load generator, the faster setting) at 32 concurrent keep-alive
    connections, each commanding its own ``InventoryItem`` with ``receive_stock`` (quantity 1, a fresh
    ``Idempotency-Key`` each time), driven two ways: by ``wrk`` (``bench/wrk.py``, ``bench/http_post.lua``:
    one wrk thread per connection, every status checked, any unexpected one failing the benchmark), and by
    32 Python threads of the standard library's ``http.client`` (which share the two cores with the server
    and cost about as much CPU per request as it does). Both beside in-process ``dispatch`` with 32 threads
    measured in the same run against the same database with the same pool per process (8 + 40 overflow) and
    the same command mix (``bench.command_throughput.measure_commitline``, its threads on one CPU as in the
    server's workers, ``COMMITLINE_DISPATCH_CPU``). Warm-up, then a fixed window; rounds alternate the order
    and the best of each is reported with its p50/p99 latency and the server's CPU per command (serving
    process and workers, ``psutil``). The goal reads the wrk line's ``ratio``: http / in_process. Also driven
    by ``wrk``: ``commitline serve --workers 2`` (the line ``wrk workers=2``), one worker per core.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from math import nan
from typing import Any

import orjson
import psutil

from bench.command_throughput import drive, measure_commitline, placements
from bench.harness import POOL_MAX_OVERFLOW, POOL_SIZE, BenchContext, fresh_schema, run_together
from bench.wrk import run_wrk

CLIENTS = 32
CONTENDERS = 50
WORKERS = 2
TENANT = "bench"


@dataclass(frozen=True)
class Served:
    """A running ``commitline serve``: where it listens, a tenant's API key, and its process id."""

    host: str
    port: int
    key: str
    pid: int

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by the serving process and its worker processes."""
        main = psutil.Process(self.pid)
        total = 0.0
        for process in [main, *main.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=120)

    def post(self, conn: http.client.HTTPConnection, command: dict[str, Any], key: str) -> tuple[int, bytes]:
        conn.request("POST", "/v1/commands", body=orjson.dumps(command), headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.key}", "Idempotency-Key": key})
        response = conn.getresponse()
        return response.status, response.read()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(host: str, port: int) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", "/openapi.json")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def serving(dsn: str, schema: str, workers: int = WORKERS, timeout: float = 120) -> Iterator[Served]:
    """``commitline serve --workers N --no-access-log`` on a free loopback port, with a tenant key made by
    ``commitline tenants add``; stopped with SIGTERM (its in-flight requests finished) at the end."""
    env = {**os.environ, "COMMITLINE_DATABASE_URL": dsn, "COMMITLINE_SCHEMA": schema,
           "COMMITLINE_POOL_SIZE": str(POOL_SIZE), "COMMITLINE_POOL_MAX_OVERFLOW": str(POOL_MAX_OVERFLOW)}
    cli = [sys.executable, "-m", "commitline.cli"]
    added = subprocess.run([*cli, "tenants", "add", TENANT], capture_output=True, text=True, env=env, timeout=timeout)
    if added.returncode != 0:
        raise RuntimeError(f"commitline tenants add failed: {added.stderr.strip()}")
    host, port = "127.0.0.1", _free_port()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen([*cli, "serve", "--host", host, "--port", str(port), "--workers", str(workers),
                                    "--no-access-log"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while not _answers(host, port):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    output = log.read().decode(errors="replace")
                    raise RuntimeError(f"commitline serve did not start:\n{output[-2000:]}")
                time.sleep(0.1)
            yield Served(host, port, added.stdout.strip(), process.pid)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


# --------------------------------------------------------------------------- contention


def contention_outcomes(served: Served, contenders: int = CONTENDERS) -> Counter[str]:
    """One race: ``ok`` / ``conflict`` / ``other`` counts of ``contenders`` transitions at version 2."""
    conn = served.connection()
    try:
        status, body = served.post(conn, {"type": "create_payment", "amount": "99.99", "currency": "USD",
                                          "account": "acc-bench"}, f"create-{uuid.uuid4()}")
        if status != 201:
            raise RuntimeError(f"create_payment: {status} {body[:300]!r}")
        payment = orjson.loads(body)["aggregate_id"]
        status, body = served.post(conn, {"type": "submit_payment", "payment_id": payment, "expected_version": 1},
                                   f"submit-{uuid.uuid4()}")
        if status != 200:
            raise RuntimeError(f"submit_payment: {status} {body[:300]!r}")
    finally:
        conn.close()

    connections = [served.connection() for _ in range(contenders)]
    for c in connections:
        c.connect()  # connected before the barrier: the race is between requests, not TCP handshakes

    def transition(i: int) -> str:
        command: dict[str, Any] = ({"type": "complete_payment", "payment_id": payment, "expected_version": 2}
                                   if i % 2 else
                                   {"type": "fail_payment", "payment_id": payment, "reason": "declined",
                                    "expected_version": 2})
        status, body = served.post(connections[i], command, f"race-{uuid.uuid4()}")
        if status == 200:
            return "ok"
        if status == 409 and orjson.loads(body).get("code") == "concurrency_conflict":
            return "conflict"
        return "other"

    try:
        outcomes = run_together(contenders, transition)
    finally:
        for c in connections:
            c.close()
    return Counter(o if isinstance(o, str) else "other" for o in outcomes)


def http_contention(ctx: BenchContext) -> Iterator[str]:
    with fresh_schema(ctx.dsn) as schema, serving(ctx.dsn, schema) as served:
        kinds = contention_outcomes(served)
    yield f"http contention: ok={kinds['ok']} conflict={kinds['conflict']} other={kinds['other']}"


# --------------------------------------------------------------------------- throughput


@dataclass(frozen=True)
class Figure:
    """One measured window: commands/s, latency, and the server's CPU per command (nan in process)."""

    rate: float
    p50: float  # seconds
    p99: float
    cpu_us: float = float("nan")  # server CPU (serving process and workers) per command, microseconds


def _create_items(served: Served, run: str, count: int) -> list[str]:
    """``count`` new items, each made by a receive_stock over HTTP (201)."""
    items = [str(uuid.uuid4()) for _ in range(count)]
    conn = served.connection()
    try:
        for i, item in enumerate(items):
            status, body = served.post(conn, {"type": "receive_stock", "item_id": item, "quantity": 1},
                                       f"{run}-create-{i}")
            if status != 201:
                raise RuntimeError(f"receive_stock (new item): {status} {body[:300]!r}")
    finally:
        conn.close()
    return items


def measure_wrk(served: Served, clients: int, warmup: int, duration: int) -> Figure:
    """``wrk`` with ``clients`` connections (one thread each), each looping receive_stock on its own item with
    a fresh key (``bench/http_post.lua``); a warm-up run creates the items (201, then 200), the measured run
    follows up on them (200 only). Any other answer fails the benchmark."""
    run = uuid.uuid4().hex[:8]
    url = f"http://{served.host}:{served.port}/v1/commands"
    env = {"BENCH_KEY": served.key, "BENCH_ITEMS": ",".join(str(uuid.uuid4()) for _ in range(clients))}
    run_wrk(url, connections=clients, duration=warmup, env={**env, "BENCH_RUN": f"{run}-w", "BENCH_CREATE": "1"})
    cpu = served.cpu_seconds()
    report = run_wrk(url, connections=clients, duration=duration, env={**env, "BENCH_RUN": run, "BENCH_CREATE": "0"})
    cpu = served.cpu_seconds() - cpu
    return Figure(report.rate, report.p50, report.p99, cpu / report.requests * 1e6 if report.requests else nan)


def measure_python(served: Served, clients: int, warmup: float, duration: float) -> Figure:
    """``clients`` Python threads, each on its own keep-alive connection and its own item, looping
    receive_stock (``http.client``)."""
    run = uuid.uuid4().hex[:8]
    items = _create_items(served, run, clients)
    connections = [served.connection() for _ in range(clients)]
    cpu: dict[str, float] = {}
    try:
        def command(i: int, seq: int) -> None:
            status, body = served.post(connections[i], {"type": "receive_stock", "item_id": items[i], "quantity": 1},
                                       f"{run}-{i}-{seq}")
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")

        cpu["start"] = served.cpu_seconds()
        m = drive(clients, command, warmup, duration)
        cpu["used"] = served.cpu_seconds() - cpu["start"]  # warm-up included: per request sent in both
    finally:
        for c in connections:
            c.close()
    if m.errors:
        raise RuntimeError(f"http (python clients): {m.errors} failed commands, first: "
                           f"{type(m.first_error).__name__}: {m.first_error}")
    sent = m.rate * (warmup + duration)  # about: the warm-up's pace taken as the window's
    return Figure(m.rate, m.percentile(0.5), m.percentile(0.99), cpu["used"] / sent * 1e6 if sent else nan)


def measure_in_process(ctx: BenchContext, schema: str, clients: int, warmup: float, duration: float) -> Figure:
    m = measure_commitline(ctx, schema, clients, warmup, duration, placements()[-1])
    if m.errors:
        raise RuntimeError(f"in_process: {m.errors} failed commands, first: {type(m.first_error).__name__}: "
                           f"{m.first_error}")
    return Figure(m.rate, m.percentile(0.5), m.percentile(0.99))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def http_throughput(ctx: BenchContext) -> Iterator[str]:
    warmup, duration, rounds = (0.5, 2, 1) if ctx.quick else (1.0, 4, 2)
    names = ("wrk", "python", "wrk_workers", "in_process")
    best: dict[str, Figure] = {}
    with fresh_schema(ctx.dsn) as http_schema, fresh_schema(ctx.dsn) as local_schema, \
            serving(ctx.dsn, http_schema, workers=1) as served, serving(ctx.dsn, http_schema) as served_by_workers:
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                f = (measure_wrk(served, CLIENTS, 1, duration) if name == "wrk"
                     else measure_python(served, CLIENTS, warmup, duration) if name == "python"
                     else measure_wrk(served_by_workers, CLIENTS, 1, duration) if name == "wrk_workers"
                     else measure_in_process(ctx, local_schema, CLIENTS, warmup, duration))
                if name not in best or f.rate > best[name].rate:
                    best[name] = f
    local = best["in_process"]
    for name, driver in (("wrk", "wrk"), ("python", "python_clients"), ("wrk_workers", f"wrk workers={WORKERS}")):
        f = best[name]
        ratio = f.rate / local.rate if local.rate else nan
        yield (f"http commands/s {driver}: http={f.rate:.0f} in_process={local.rate:.0f} ratio={ratio:.2f} "
               f"p50_ms={_ms(f.p50)} p99_ms={_ms(f.p99)} in_process_p50_ms={_ms(local.p50)} "
               f"in_process_p99_ms={_ms(local.p99)} server_cpu_us_per_command={f.cpu_us:.0f}"
               + (" (goal reads this ratio: commitline serve driven by wrk / in-process dispatch, 32 clients)"
                  if name == "wrk" else ""))
    yield (f"# http: commitline serve (one worker process, its default) and, on the line 'wrk workers={WORKERS}', "
           f"commitline serve --workers {WORKERS}; {CLIENTS} keep-alive connections, receive_stock on {CLIENTS} "
           f"items, driven by wrk (one thread per connection) and by {CLIENTS} Python threads (http.client); "
           f"in_process: {CLIENTS} threads calling dispatch, same commands; {os.cpu_count()} CPUs shared by the "
           "load generator, the server and PostgreSQL")


#: What ``python -m bench`` runs from this module, in order: (name, callable).
BENCHMARKS = (("http_contention", http_contention), ("http_throughput", http_throughput))


if __name__ == "__main__":  # python -m bench.http_api [--quick]: this module alone
    from bench.harness import open_database

    with open_database() as (dsn, description):
        print(f"# database: {description}", flush=True)
        bench_ctx = BenchContext(dsn=dsn, quick="--quick" in sys.argv)
        for bench_name, func in BENCHMARKS:
            started = time.perf_counter()
            for line in func(bench_ctx):
                print(line, flush=True)
            print(f"# {bench_name} took {time.perf_counter() - started:.1f} s", flush=True)

