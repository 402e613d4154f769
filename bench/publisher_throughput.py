"""The Kafka publisher: catch-up throughput, and commit-to-ack latency under a steady load.

Broker: ``KAFKA_BOOTSTRAP_SERVERS`` if set (idempotence then follows
``COMMITLINE_KAFKA_IDEMPOTENCE``, like every other ``COMMITLINE_KAFKA_*`` variable), else the
embedded Tansu broker that ``Commitline.start_embedded_kafka_if_unset()`` starts (idempotence off: Tansu rejects
InitProducerId). Every measured run writes to fresh topics, ``bench<random><letter>.<Aggregate>``
(one letter per run, so all topic names have the same length), created beforehand with the
same partition count (``COMMITLINE_KAFKA_PARTITIONS``, default 6). Both sides produce with the
product's own producer configuration (``kafka_producer.new_producer``: acks="all", linger 0,
512 KiB record batches, idempotence as above).

``publish_throughput``
    The event log is pre-filled with 60,000 ``StockReceived`` events (``--quick``: 20,000)
    over 1,000 ``InventoryItem`` aggregates: ``recorder.append`` of 1,000 stored events per
    transaction (version v of every aggregate), built with ``codec.encode_event`` from real
    domain events (with valid per-stream hash-chain links precomputed when the recorder's
    ``append`` takes ``links``; otherwise it would look up each event's predecessor). Then 1 and 2
    publish instances, each its own process (``bench/publish_process.py``: what ``commitline publish
    --drain`` runs, ``app.publisher()`` and ``app.run_until_signalled``), publish everything from
    position 0 with the default batch size (``COMMITLINE_PUBLISH_BATCH_SIZE``, 2,000) and
    ``COMMITLINE_PUBLISH_BUCKETS`` buckets. The processes start together; each says ``ready`` once it
    joined, owns its fair share of the buckets and started its producer (until ``go`` its log reads
    return nothing), and the bench tells them all to go at once. Timed: from ``go`` until the last
    process had every bucket it owns at the head, positions saved. Every record is then read back by a
    consumer (distinct event ids, each aggregate's versions 1, 2, 3... in order): that count is the
    events/s figure. CPU in the window: each publish process's own (user + system, all threads), the
    embedded broker's and the PostgreSQL server's (``/proc``, when they run on this machine), printed
    per event. From the one-process figures a scaling model says what N cores would give
    (``scaling_model``).

    Baseline, same run, same broker, same records: before any measurement the whole log is
    read with ``select_notifications`` and turned into the very same records with
    ``to_record`` (same keys, values, headers, timestamps; this read also warms the table for
    both sides). They are kept as plain tuples, which the GC stops tracking. A bare
    ``AIOKafkaProducer`` in the bench's process then sends them with ``send_batch`` per partition:
    grouped by partition (murmur2, as aiokafka's default partitioner and the publisher do), packed
    into as few record batches as fit, every batch queued at once, all acks awaited at the end;
    grouping and batch building (including turning each held header tuple back into the list
    aiokafka wants) are timed, from after ``producer.start()`` to the last ack, and its CPU time
    too. That is the fastest honest raw variant: the per-record ``send()`` pipeline is 2-3x slower
    in Python (``measure_raw_send``, not run by default). Rounds: raw, 1, 2 processes; (full run:) raw,
    2, 1 processes; raw, 1, 2 processes. The best run of each is reported: three runs each (``--quick``: one),
    so every figure had as many chances as its baseline. The goal lines: one process / raw
    ``send_batch`` (>= 0.7), 2 processes / 1 (>= 1.0).

    ``BENCH_PUBLISH_PYTHONPATH`` runs the publish processes on another checkout's code (a before/after
    comparison in one run of the same bench); ``BENCH_PROFILE=<file>`` writes each process's cProfile.

``commit_to_ack_latency``
    The publisher runs on its own event loop in a thread (as in production: never on the
    command path). 4 writer threads dispatch ``receive_stock`` on their own item, paced to 300
    commands/s in total, for 10 s (``--quick``: 3 s) after a warm-up whose events were already
    acknowledged (producer started, topics created). For each command: commit time = when
    ``dispatch`` returned, keyed by ``result.events[0].event_id``; ack time = when
    ``on_published`` reported that event id (the publisher calls it after the broker acked the
    batch *and* the position was saved). Printed: p50/p99/max of ack - commit, and n.

    Baseline (the floor): a bare ``AIOKafkaProducer`` to the same broker sends the same records
    (captured from ``on_published``) one at a time at the same rate, each
    ``await (await producer.send(...))``; its send-to-ack latency p50/p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson
import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import murmur2
from eventsourcing.persistence import StoredEvent

from bench.harness import BenchContext, commitline_app, fresh_schema, run_together
from commitline.composition import Commitline
from commitline.domain.aggregate import utcnow
from commitline.examples import domain
from commitline.examples.inventory import StockReceived
from commitline.infrastructure.store.codec import encode_event
from commitline.infrastructure.config import Settings, load_settings
from commitline.infrastructure.kafka.envelope import KafkaRecord, to_record, topic_for
from commitline.infrastructure.followers.thread import FollowerThread
from commitline.infrastructure.kafka.producer import client_options, ensure_topics, new_producer
from commitline.infrastructure.kafka.publisher import PUBLISHER
from commitline.infrastructure.store.recorder import EventRecorder

AGGREGATE_COUNT = 1_000
APPEND_CHUNK = 1_000  # stored events per recorder.append (one transaction)
OWNER = "bench-publisher"

# --------------------------------------------------------------------------- shared plumbing


def kafka_overrides() -> dict[str, Any]:
    """The configured Kafka (every ``kafka_*`` setting from the environment), or {} for the embedded one."""
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        return {}
    env = load_settings()
    return {name: getattr(env, name) for name in Settings.model_fields
            if name.startswith("kafka_") and name != "kafka_topic_prefix"}


@contextlib.contextmanager
def kafka_app(ctx: BenchContext, schema: str) -> Iterator[tuple[Commitline, Settings, Callable[[str], str]]]:
    """(app, settings with a broker and the commitline prefix ``bench<tag>c.``, letter -> ``bench<tag><letter>.``)."""
    tag = uuid.uuid4().hex[:8]
    with commitline_app(ctx.dsn, schema, kafka_topic_prefix=f"bench{tag}c.", **kafka_overrides()) as app:
        yield app, app.start_embedded_kafka_if_unset(), lambda letter: f"bench{tag}{letter}."


def retarget(records: Sequence[KafkaRecord], old_prefix: str, new_prefix: str) -> list[KafkaRecord]:
    """The same records (keys, values, headers, timestamps) for the topics of another prefix."""
    return [KafkaRecord(new_prefix + r.topic[len(old_prefix):], r.key, r.value, r.headers, r.timestamp_ms,
                        r.notification_id, r.event_id) for r in records]


def all_topics(prefix: str) -> list[str]:
    return [topic_for(prefix, a.__name__) for a in domain.check().registry.aggregates]


async def started_raw_producer(settings: Settings, prefix: str) -> AIOKafkaProducer:
    """Topics of ``prefix`` created, then a started producer with the publisher's configuration."""
    await ensure_topics(settings, all_topics(prefix))
    producer = new_producer(settings, f"bench-raw-{uuid.uuid4().hex[:6]}")
    await producer.start()
    return producer


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --------------------------------------------------------------------------- publish_throughput


def chain_links() -> Callable[[Sequence[StoredEvent]], list[tuple[bytes, bytes]]] | None:
    """If the recorder takes precomputed hash-chain ``links``, a function computing them per stream
    (each item's chain continues from its previous event in this prefill); else None."""
    if "links" not in inspect.signature(EventRecorder.append).parameters:
        return None
    from commitline.application.chain import GENESIS, chain

    heads: dict[uuid.UUID, bytes] = {}

    def links(events: Sequence[StoredEvent]) -> list[tuple[bytes, bytes]]:
        out = []
        for e in events:
            out.append(chain(heads.get(e.originator_id, GENESIS), [e])[0])
            heads[e.originator_id] = out[-1][1]
        return out

    return links


def prefill(app: Commitline, events: int) -> None:
    """``events`` StockReceived events over AGGREGATE_COUNT items, APPEND_CHUNK per transaction."""
    items = [uuid.uuid4() for _ in range(AGGREGATE_COUNT)]
    links = chain_links()  # without them the recorder would look up each event's predecessor
    chunk: list[StoredEvent] = []
    for n in range(events):
        version, item = divmod(n, AGGREGATE_COUNT)
        event = StockReceived(event_id=uuid.uuid4(), aggregate_id=items[item], version=version + 1,
                              occurred_at=utcnow(), quantity=1 + n % 50)
        chunk.append(encode_event(event, "default"))
        if len(chunk) == APPEND_CHUNK or n == events - 1:
            if links is None:
                app.recorder.append(chunk)
            else:
                app.recorder.append(chunk, links=links(chunk))  # type: ignore[call-arg]
            chunk = []


#: A record as the raw baseline keeps it: (topic, key, value, headers, timestamp_ms), tuples only.
RawRow = tuple[str, bytes, bytes, tuple[tuple[str, bytes], ...], int]


def read_rows(app: Commitline, settings: Settings) -> tuple[RawRow, ...]:
    """Every notification of the log, as the records the publisher builds (``to_record``), kept as
    a tuple of plain tuples: after a few collections the GC tracks none of them, so holding 100k
    costs the publisher's run nothing (a list of 100k tracked records would be scanned by every
    full collection during it, a cost no real publisher pays)."""
    rows: list[RawRow] = []
    position = 0
    while True:
        batch = app.recorder.select_notifications(position + 1, settings.publish_batch_size)
        if not batch:
            break
        for n in batch:
            r = to_record(n, settings.kafka_topic_prefix, OWNER, domain.registry)
            rows.append((r.topic, r.key, r.value, tuple(r.headers), r.timestamp_ms))
        position = batch[-1].id
    held = tuple(rows)
    del rows
    for _ in range(4):  # one nesting level of tuples is untracked per collection
        gc.collect()
    return held


def reset_positions(app: Commitline) -> None:
    """Publish from position 0 again: the bench schema's publisher rows (the group's and its buckets') go."""
    with psycopg.connect(**app.conninfo, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {app.settings.schema_name}.follower_positions WHERE name = %s "
                     "OR starts_with(name, %s)", (PUBLISHER, f"{PUBLISHER}/"))


def process_cpu(pids: Sequence[int], reaped_of: int | None = None) -> float:
    """CPU seconds (user + system) the processes ``pids`` used so far, plus, with ``reaped_of``, what its
    children that already ended used (``/proc``; processes that are gone count 0)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
        if pid == reaped_of:
            total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total / tick


def postgres_pids(app: Commitline) -> tuple[int, list[int]] | None:
    """(postmaster pid, every pid of its server) when the bench database runs on this machine, else None."""
    with psycopg.connect(**app.conninfo, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    try:
        with open(f"/proc/{backend}/stat") as f:
            postmaster = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{postmaster}/comm") as f:
            if "postgres" not in f.read():
                return None
    except OSError:
        return None
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == postmaster:
                        pids.append(int(entry))
            except OSError:
                continue
    return postmaster, pids


def service_cpu(app: Commitline) -> dict[str, float]:
    """CPU seconds so far of the broker (the embedded one) and of the PostgreSQL server (when local)."""
    out: dict[str, float] = {}
    broker = getattr(app.embedded_kafka, "pid", None)
    if broker is not None:
        out["broker"] = process_cpu([broker])
    server = postgres_pids(app)
    if server is not None:
        out["postgresql"] = process_cpu(server[1], reaped_of=server[0])
    return out


async def delivered(settings: Settings, expected: int) -> tuple[int, int]:
    """(records, distinct event ids) the run's topics hold, read back by a consumer from the beginning until
    ``expected`` distinct events were seen (or 2 s brought nothing new); raises if an aggregate's events
    arrive out of order or with one missing (its versions must go 1, 2, 3...). An independent count (Tansu's end offsets count a record batch as one offset)."""
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False, auto_offset_reset="earliest",
                                request_timeout_ms=10_000, max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    try:
        await consumer.topics()  # the metadata of every topic
        consumer.assign([TopicPartition(t, p) for t in all_topics(settings.kafka_topic_prefix)
                         for p in consumer.partitions_for_topic(t) or ()])
        records, ids, versions = 0, set(), {}
        while len(ids) < expected:
            batches = await consumer.getmany(timeout_ms=2_000, max_records=10_000)
            if not batches:
                break
            for batch in batches.values():
                for message in batch:
                    records += 1
                    envelope = orjson.loads(message.value)
                    if envelope["event_id"] in ids:
                        continue  # sent twice (at-least-once): counted once
                    ids.add(envelope["event_id"])
                    previous = versions.get(message.key, 0)
                    if envelope["version"] != previous + 1:
                        raise AssertionError(f"aggregate {message.key!r}: version {envelope['version']} after "
                                             f"{previous}")
                    versions[message.key] = envelope["version"]
        return records, len(ids)
    finally:
        await consumer.stop()


@dataclass
class Window:
    """One measured run of ``instances`` publish processes."""

    instances: int
    seconds: float  # from ``go`` until the last process had every bucket it owned at the head, positions saved
    published: int  # what the processes say they published
    delivered: int  # distinct events the topics hold, read back by a consumer
    records: int  # records the topics hold (more than ``delivered`` if any event was sent twice)
    cpu: dict[str, float]  # CPU seconds in the window: publish (all processes), broker, postgresql
    each: list[float]  # seconds from ``go`` until each process was done

    def per_event(self, part: str) -> float:
        return self.cpu[part] / self.delivered


def measure_processes(dsn: str, app: Commitline, settings: Settings, instances: int, head: int) -> Window:
    """``instances`` publish processes (``bench/publish_process.py``: what ``commitline publish --drain`` runs) started
    together from position 0: timed from ``go`` (every process joined, owns its fair share of the buckets, its
    producer started and the topics created) until every process had all its buckets at the head."""
    reset_positions(app)
    buckets = settings.publish_buckets
    assert buckets % instances == 0, (buckets, instances)
    # BENCH_PUBLISH_PYTHONPATH: the processes' own path (e.g. another checkout's commitline, to compare)
    path = os.environ.get("BENCH_PUBLISH_PYTHONPATH") or os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)  # given as an argument; the other COMMITLINE_KAFKA_* stay
    procs = [subprocess.Popen([sys.executable, "-m", "bench.publish_process", dsn,
                               app.settings.schema_name, settings.kafka_bootstrap_servers or "",
                               settings.kafka_topic_prefix or "", str(buckets // instances), str(head)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(instances)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a publish process ended before its window (exit code {proc.wait()})")
        before = service_cpu(app)
        t0 = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("done "):
                raise RuntimeError(f"a publish process ended before reaching the head (exit code {proc.wait()})")
            reports.append(json.loads(line[5:]))
        after = service_cpu(app)
        for proc in procs:
            proc.communicate(timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"a publish process failed with exit code {proc.returncode}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    cpu = {"publish": sum(r["cpu"] for r in reports), **{k: after[k] - before[k] for k in after if k in before}}
    records, distinct = asyncio.run(delivered(settings, head))
    return Window(instances, max(r["done"] for r in reports) - t0, sum(r["published"] for r in reports),
                  distinct, records, cpu, sorted(r["done"] - t0 for r in reports))


def measure_raw_throughput(settings: Settings, prefix: str, rows: Sequence[RawRow],
                           old_prefix: str) -> tuple[float, float]:
    """(seconds, CPU seconds of this process) for a bare producer to send ``rows`` (to the topics of ``prefix``)
    and see every ack.

    ``send_batch`` per partition: records grouped by partition (murmur2, as aiokafka's default
    partitioner and the publisher do), packed into as few record batches as fit, every batch
    queued at once, all acks awaited at the end. Grouping and batch building are timed too.
    """

    async def main() -> tuple[float, float]:
        producer = await started_raw_producer(settings, prefix)
        try:
            t0, cpu0 = time.perf_counter(), time.process_time()
            topics: dict[str, str] = {}
            partitions: dict[str, int] = {}
            groups: dict[tuple[str, int], list[RawRow]] = defaultdict(list)
            for row in rows:
                topic = topics.get(row[0]) or topics.setdefault(row[0], prefix + row[0][len(old_prefix):])
                if topic not in partitions:
                    partitions[topic] = len(await producer.partitions_for(topic))
                groups[(topic, (murmur2(row[1]) & 0x7FFFFFFF) % partitions[topic])].append(row)
            futures = []
            for (topic, partition), group in groups.items():
                batch = producer.create_batch()
                for _, key, value, headers, timestamp_ms in group:
                    if batch.append(key=key, value=value, timestamp=timestamp_ms, headers=list(headers)) is None:
                        futures.append(await producer.send_batch(batch, topic, partition=partition))
                        batch = producer.create_batch()
                        batch.append(key=key, value=value, timestamp=timestamp_ms, headers=list(headers))
                futures.append(await producer.send_batch(batch, topic, partition=partition))
            await asyncio.gather(*futures)
            return time.perf_counter() - t0, time.process_time() - cpu0
        finally:
            await producer.stop()

    return asyncio.run(main())


def measure_raw_send(settings: Settings, prefix: str, rows: Sequence[RawRow], old_prefix: str) -> float:
    """The per-record variant, for reference: ``send()`` for each record, all futures awaited at the end."""

    async def main() -> float:
        producer = await started_raw_producer(settings, prefix)
        try:
            t0 = time.perf_counter()
            topics = {t: prefix + t[len(old_prefix):] for t in all_topics(old_prefix)}
            futures = [await producer.send(topics[topic], value, key, timestamp_ms=timestamp_ms, headers=list(headers))
                       for topic, key, value, headers, timestamp_ms in rows]
            await asyncio.gather(*futures)
            return time.perf_counter() - t0
        finally:
            await producer.stop()

    return asyncio.run(main())


INSTANCES = (1, 2)
MODEL_CORES = (2, 4, 8, 16, 32)


def scaling_model(one: Window, two: Window, buckets: int) -> Iterator[str]:
    """What N cores would give, from this run's CPU per event (publish processes, broker, PostgreSQL) and
    one process's rate. An instance is one process, bounded by its own rate here (``r1``: its CPU and its waits
    for reads and acks); all together need ``c(k)`` CPU seconds per event with k instances: the publish and
    broker parts as measured with two, PostgreSQL's growing by (2 instances' - 1 instance's) per added
    instance (each instance's filtered read hashes every row of its window: k rows hashed per event). The
    model picks the best k <= min(N, buckets): events/s = max_k min(k * r1, N / c(k)). It ignores the broker's
    own limits (one embedded Tansu here; a Kafka cluster spreads partitions) and the disks."""
    r1 = one.delivered / one.seconds
    pg1, pg2 = one.cpu.get("postgresql", 0.0) / one.delivered, two.cpu.get("postgresql", 0.0) / two.delivered
    grow = max(0.0, pg2 - pg1)

    def cost(k: int) -> float:
        if k == 1:
            return sum(one.per_event(part) for part in one.cpu)
        rest = sum(two.per_event(part) for part in two.cpu if part != "postgresql")
        return rest + pg1 + (k - 1) * grow

    yield (f"publish scaling model: r1={r1:.0f} events/s per process; CPU per event c(1)={cost(1) * 1e6:.1f}us, "
           f"c(k)={(cost(2) - grow) * 1e6:.1f}us + k x {grow * 1e6:.1f}us (PostgreSQL's filtered reads)")
    for cores in MODEL_CORES:
        best_k, best = max(((k, min(k * r1, cores / cost(k))) for k in range(1, min(cores, buckets) + 1)),
                           key=lambda kr: kr[1])
        yield (f"publish scaling model cores={cores}: instances={best_k} events/s={best:.0f} "
               f"({'CPU-bound' if best < best_k * r1 else 'instance-bound'})")
    here = os.cpu_count() or 1
    yield (f"publish scaling model check: {here} cores, 2 instances: model={min(2 * r1, here / cost(2)):.0f} "
           f"measured={two.delivered / two.seconds:.0f} events/s (the model assumes the cores are ours alone)")


def publish_throughput(ctx: BenchContext) -> Iterator[str]:
    events = 20_000 if ctx.quick else 60_000
    # each round: raw, then 1 and 2 processes (every second round in the other order): as many runs of each
    rounds = 1 if ctx.quick else 3
    ours: dict[int, list[Window]] = {n: [] for n in INSTANCES}
    raw_runs: list[tuple[float, float, float]] = []  # seconds, client CPU, broker CPU
    letters = iter("cdefghijklmnopq")
    with fresh_schema(ctx.dsn) as schema, kafka_app(ctx, schema) as (app, settings, prefix):
        t0 = time.perf_counter()
        prefill(app, events)
        fill_s = time.perf_counter() - t0
        rows = read_rows(app, settings)  # also warms the table (hint bits, cache) for both sides
        assert len(rows) == events, (len(rows), events)
        head = app.recorder.max_notification_id() or 0

        def raw_run() -> None:
            before = service_cpu(app).get("broker", 0.0)
            seconds, cpu = measure_raw_throughput(settings, prefix(next(letters)), rows, settings.kafka_topic_prefix)
            raw_runs.append((seconds, cpu, service_cpu(app).get("broker", 0.0) - before))

        for round_ in range(rounds):
            raw_run()
            for n in (INSTANCES if round_ % 2 == 0 else INSTANCES[::-1]):
                run_settings = settings.model_copy(update={"kafka_topic_prefix": prefix(next(letters))})
                asyncio.run(ensure_topics(run_settings, all_topics(run_settings.kafka_topic_prefix)))
                window = measure_processes(ctx.dsn, app, run_settings, n, head)
                assert window.published >= events and window.delivered >= events, (window, events)
                ours[n].append(window)
    best_raw = min(raw_runs)
    raw = events / best_raw[0]
    best = {n: min(ours[n], key=lambda w: w.seconds) for n in INSTANCES}
    rate = {n: best[n].delivered / best[n].seconds for n in INSTANCES}
    for n in INSTANCES:
        w = best[n]
        yield (f"publish throughput processes={n}: commitline={rate[n]:.0f} events/s raw_aiokafka={raw:.0f} "
               f"records/s ratio={rate[n] / raw:.2f}"
               + (" (goal reads ratio: one publish process / raw aiokafka send_batch of the same records)"
                  if n == 1 else ""))
        yield (f"publish cpu per event processes={n}: "
               + " ".join(f"{k}={w.per_event(k) * 1e6:.1f}us" for k in w.cpu)
               + f"; raw aiokafka client={best_raw[1] / events * 1e6:.1f}us broker={best_raw[2] / events * 1e6:.1f}us")
    yield (f"publish processes: 2 vs 1 ratio={rate[2] / rate[1]:.2f} (goal: 2 publish processes / 1, "
           "started together on the same prefilled log, >= 1.0)")
    yield from scaling_model(best[1], best[2], settings.publish_buckets)
    yield (f"publish throughput details: {events} events over {AGGREGATE_COUNT} aggregates, "
           f"{settings.publish_buckets} buckets; each instance a process running what commitline publish --drain "
           f"runs; delivered counted by a consumer reading the topics back; runs "
           f"{'; '.join(f'{n}: ' + ', '.join('/'.join(f'{e:.2f}' for e in w.each) for w in ours[n]) for n in INSTANCES)} s "
           "(each process's); "
           f"raw send_batch runs {', '.join(f'{r[0]:.2f}' for r in raw_runs)} s; "
           f"avg value {sum(len(r[2]) for r in rows) // len(rows)} B; prefill {fill_s:.1f} s; "
           f"broker {'KAFKA_BOOTSTRAP_SERVERS' if kafka_overrides() else 'embedded Tansu'}")


# --------------------------------------------------------------------------- commit_to_ack_latency


def wait_for(condition: Callable[[], bool], timeout: float, what: str, background: FollowerThread) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if background.error is not None:
            raise background.error
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def paced(rate: float, duration: float, phase: float, start: float, body: Callable[[int], None]) -> None:
    """Call body(seq) at ``rate`` per second from ``start + phase`` for ``duration`` s (no catch-up bursts)."""
    interval = 1 / rate
    due = start + phase
    end = start + duration
    seq = 0
    while due < end:
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        body(seq)
        seq += 1
        due = max(due + interval, time.perf_counter())


def measure_raw_latency(settings: Settings, prefix: str, records: Sequence[KafkaRecord], rate: float) -> list[float]:
    """Send-to-ack latency of each record (topics of ``prefix``) sent alone, one at a time, at ``rate`` per second."""

    async def main() -> list[float]:
        producer = await started_raw_producer(settings, prefix)
        try:
            for r in records[:20]:  # warm-up: metadata and connections of every partition's leader
                await (await producer.send(r.topic, r.value, r.key, timestamp_ms=r.timestamp_ms, headers=r.headers))
            latencies = []
            due = time.perf_counter()
            for r in records:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                t0 = time.perf_counter()
                await (await producer.send(r.topic, r.value, r.key, timestamp_ms=r.timestamp_ms, headers=r.headers))
                latencies.append(time.perf_counter() - t0)
                due = max(due + 1 / rate, time.perf_counter())
            return latencies
        finally:
            await producer.stop()

    return asyncio.run(main())


def commit_to_ack_latency(ctx: BenchContext) -> Iterator[str]:
    writers, rate = 4, 300.0
    duration = 3.0 if ctx.quick else 10.0
    committed: dict[str, float] = {}
    acked: dict[str, float] = {}
    published: list[KafkaRecord] = []

    def on_published(records: Sequence[KafkaRecord]) -> None:
        now = time.perf_counter()
        for r in records:
            acked.setdefault(r.event_id, now)
        published.extend(records)

    with fresh_schema(ctx.dsn) as schema, kafka_app(ctx, schema) as (app, settings, prefix):
        run = uuid.uuid4().hex[:8]
        with FollowerThread(lambda: app.publisher(settings, owner=OWNER, on_published=on_published)) as background:
            items = []
            for i in range(writers):  # warm-up: items created, producer started, topics created
                result = app.dispatch({"type": "receive_stock", "item_id": str(uuid.uuid4()), "quantity": 1},
                                      idempotency_key=f"{run}-create-{i}")
                items.append(str(result.aggregate_id))
                warm_id = str(result.events[0].event_id)
                wait_for(lambda: warm_id in acked, 60, "the warm-up events to be acknowledged", background)

            def writer(i: int) -> int:
                def command(seq: int) -> None:
                    result = app.dispatch({"type": "receive_stock", "item_id": items[i], "quantity": 1},
                                          idempotency_key=f"{run}-{i}-{seq}")
                    committed[str(result.events[0].event_id)] = time.perf_counter()

                paced(rate / writers, duration, i / rate, window_start, command)
                return 0

            window_start = time.perf_counter() + 0.05
            outcomes = run_together(writers, writer, timeout=duration + 60)
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            if errors:
                raise errors[0]
            wait_for(lambda: all(e in acked for e in list(committed)), 30, "every command's event to be acked",
                     background)
        measured = [r for r in published if r.event_id in committed]
        raw = measure_raw_latency(settings, prefix("r"), retarget(measured, settings.kafka_topic_prefix, prefix("r")),
                                  rate)
    latencies = [acked[e] - t for e, t in committed.items()]
    yield (f"commit-to-ack latency: commitline p50={percentile(latencies, 0.5) * 1000:.1f}ms "
           f"p99={percentile(latencies, 0.99) * 1000:.1f}ms max={max(latencies) * 1000:.1f}ms "
           f"(n={len(latencies)}, {len(latencies) / duration:.0f} commands/s); raw aiokafka send+ack "
           f"p50={percentile(raw, 0.5) * 1000:.1f}ms p99={percentile(raw, 0.99) * 1000:.1f}ms (n={len(raw)})")


#: What ``python -m bench`` runs from this module, in order: (name, callable).
BENCHMARKS = (("publish_throughput", publish_throughput), ("commit_to_ack_latency", commit_to_ack_latency))
