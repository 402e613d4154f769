"""The Kafka publisher against a real broker over TCP: every assertion is on what a consumer reads back."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from uuid import uuid4

import orjson
import psycopg
import pytest
from jsonschema_rs import Draft202012Validator

from commitline.composition import Commitline, bootstrap
from commitline.infrastructure.embedded.kafka import EmbeddedKafka
from commitline.infrastructure.kafka.envelope import ENVELOPE_SCHEMA
from tests.integration.test_concurrency import run_at_once
from tests.support import ConsumedRecord, FollowerThread, kafka_settings, read_topics, settings_for, wait_for


def stored_events(dsn: str, schema: str) -> dict[str, tuple[str, int]]:
    """event id -> (aggregate id, version), straight from the store."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT originator_id, originator_version, state FROM {schema}.events").fetchall()
    import orjson

    return {orjson.loads(bytes(s))["id"]: (str(a), v) for a, v, s in rows}


def check_stream(records: list[ConsumedRecord], expected: dict[str, tuple[str, int]]) -> int:
    """Assert completeness and per-aggregate order; return the number of duplicates."""
    first_seen: dict[str, ConsumedRecord] = {}
    duplicates = 0
    partitions_of: dict[str, set[tuple[str, int]]] = defaultdict(set)
    last_version: dict[str, int] = {}
    for r in records:  # sorted by topic, partition, offset: the order a consumer reads
        env = r.envelope
        assert r.key == env["aggregate_id"] and r.headers["event_id"] == env["event_id"]
        partitions_of[env["aggregate_id"]].add((r.topic, r.partition))
        if env["event_id"] in first_seen:
            duplicates += 1
            continue
        first_seen[env["event_id"]] = r
        previous = last_version.get(env["aggregate_id"], 0)
        assert env["version"] == previous + 1, (
            f"aggregate {env['aggregate_id']}: version {env['version']} read after {previous}")
        last_version[env["aggregate_id"]] = env["version"]
    assert set(first_seen) == set(expected), (
        f"missing {len(set(expected) - set(first_seen))}, unexpected {len(set(first_seen) - set(expected))}")
    assert all(len(p) == 1 for p in partitions_of.values()), "an aggregate's records must share one partition"
    for event_id, r in first_seen.items():
        assert (r.envelope["aggregate_id"], r.envelope["version"]) == expected[event_id]
    return duplicates


def writer_workload(app: Commitline, writers: int, commands_each: int, tag: str) -> None:
    shared = [uuid4() for _ in range(3)]  # contended streams: their conflicts leave gaps in the log

    def write(i: int) -> None:
        own = uuid4()
        for n in range(commands_each):
            item = shared[n % 3] if n % 10 == 0 else own
            app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1},
                         idempotency_key=f"{tag}-{i}-{n}")

    outcomes = run_at_once(writers, write)
    assert not [o for o in outcomes if isinstance(o, Exception)]


def test_every_event_exactly_once_in_order_under_concurrent_writers(pg_dsn: str, schema: str,
                                                                     kafka_bootstrap: str) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_batch_size=500)
    with bootstrap(settings) as app, FollowerThread(app.publisher) as background:
        writer_workload(app, writers=20, commands_each=250, tag="w")
        head = app.recorder.max_notification_id()
        background.wait_until_at(head)
        expected = stored_events(pg_dsn, schema)
        assert len(expected) == 5000
        records = read_topics(kafka_bootstrap, settings.kafka_topic_prefix, len(expected))
        duplicates = check_stream(records, expected)
        assert duplicates == 0, "a healthy run publishes each event once"
        envelope = records[0].envelope
        assert set(envelope) == {"event_id", "type", "schema_version", "aggregate_type", "aggregate_id", "version",
                                 "notification_id", "generation", "recorded_at", "tenant", "payload"}
        assert envelope["generation"] == 1 and records[0].headers["generation"] == "1"
        documented = Draft202012Validator(ENVELOPE_SCHEMA, validate_formats=True)
        for record in records:
            errors = [e.message for e in documented.iter_errors(record.envelope)]
            assert not errors, f"a published envelope is not what the reference documents: {errors}"
        assert envelope["schema_version"] == 1
        assert envelope["payload"] == {"quantity": envelope["payload"]["quantity"]}


def publisher_process(pg_dsn: str, schema: str, bootstrap_servers: str, *extra: str, **settings: str
                      ) -> subprocess.Popen:
    env = {**os.environ, **settings, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers, "COMMITLINE_KAFKA_IDEMPOTENCE": "false",
           "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}.", "COMMITLINE_KAFKA_PARTITIONS": "4",
           "COMMITLINE_PUBLISH_BATCH_SIZE": "50", "COMMITLINE_PUBLISH_POLL_INTERVAL_MS": "200"}
    return subprocess.Popen([sys.executable, "-m", "commitline.cli", "publish", *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def drain(pg_dsn: str, schema: str, bootstrap_servers: str) -> None:
    proc = publisher_process(pg_dsn, schema, bootstrap_servers, "--drain")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()[-3000:]


def keep_writing(app: Commitline, stop: threading.Event, tag: str) -> threading.Thread:
    def write() -> None:
        items = [uuid4() for _ in range(20)]
        n = 0
        while not stop.is_set():
            app.dispatch({"type": "receive_stock", "item_id": str(items[n % 20]), "quantity": 1},
                         idempotency_key=f"{tag}-{n}")
            n += 1

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_publisher_killed_repeatedly_loses_and_reorders_nothing(
    pg_dsn: str, schema: str, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap)
    with bootstrap(settings) as app:
        stop = threading.Event()
        writer = keep_writing(app, stop, "crash")
        kills = 0
        try:
            for _ in range(6):
                proc = publisher_process(pg_dsn, schema, kafka_bootstrap)
                time.sleep(random.uniform(0.8, 2.0))
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                kills += 1
        finally:
            stop.set()
            writer.join(30)
        drain(pg_dsn, schema, kafka_bootstrap)
        expected = stored_events(pg_dsn, schema)
        records = read_topics(kafka_bootstrap, settings.kafka_topic_prefix, len(expected))
        duplicates = check_stream(records, expected)
    with capsys.disabled():
        print(f"\n[crash test] {kills} SIGKILLs, {len(expected)} events, {duplicates} duplicates re-sent, 0 missing")
    assert kills >= 5


def test_broker_outage_delays_but_loses_nothing(pg_dsn: str, schema: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="commitline.infrastructure.kafka.publisher")
    broker = EmbeddedKafka()
    broker.start()
    settings = kafka_settings(pg_dsn, schema, broker.bootstrap_servers, publish_max_backoff_ms=1000)
    try:
        with bootstrap(settings) as app, FollowerThread(app.publisher) as background:
            writer_workload(app, writers=4, commands_each=50, tag="before")
            head_before = app.recorder.max_notification_id()
            background.wait_until_at(head_before)
            before = read_topics(broker.bootstrap_servers, settings.kafka_topic_prefix, 200)

            broker.kill()  # in-memory broker: what it held is gone, and what it had acked was consumed above
            outage_started = time.monotonic()
            writer_workload(app, writers=4, commands_each=50, tag="during")  # commands keep succeeding
            while background.follower.metrics.retries < 2 and time.monotonic() - outage_started < 60:
                time.sleep(0.2)
            assert background.follower.metrics.retries >= 2, "the publisher must notice and keep retrying"
            assert background.follower.metrics.position == head_before, "nothing unacknowledged was saved"
            broker.start()  # same port, several seconds later

            background.wait_until_at(app.recorder.max_notification_id(), timeout=90)
            after = read_topics(broker.bootstrap_servers, settings.kafka_topic_prefix, 200)
            expected = stored_events(pg_dsn, schema)
            assert len(expected) == 400
            before_ids = {r.envelope["event_id"] for r in before}
            assert before_ids == {e for e in expected if e in before_ids} and len(before_ids) == 200
            check_stream(before + after, expected)
        messages = [r.getMessage() for r in caplog.records if r.name == "commitline.infrastructure.kafka.publisher"]
        assert sum("kafka unavailable" in m for m in messages) == 1, "an outage is logged once, not per retry"
        assert sum("kafka available again" in m for m in messages) == 1
    finally:
        broker.stop()


def test_a_drain_stopped_before_it_caught_up_exits_1_saying_so(pg_dsn: str, schema: str) -> None:
    """``publish --drain`` against a broker that is down retries; stopped by SIGTERM before it caught up, it must
    not exit 0 as a finished drain does: a script would take the events waiting for published."""
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        writer_workload(app, writers=1, commands_each=3, tag="waiting")
        env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
               "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "COMMITLINE_KAFKA_IDEMPOTENCE": "false",
               "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}."}
        proc = subprocess.Popen([sys.executable, "-m", "commitline.cli", "publish", "--drain", "--json"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: any(s.status == "retrying" for s in [*app.status().followers,
                                                                   *app.status().publisher.buckets]),
                     "the publisher to retry the broker")
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 1, stderr.decode()[-3000:]
    assert orjson.loads(stdout)["events_published"] == 0
    assert "interrupted before it caught up" in stderr.decode()


def owner_of(pg_dsn: str, schema: str) -> str | None:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f"SELECT owner FROM {schema}.follower_positions WHERE name = 'kafka-publisher'").fetchone()
    return row[0] if row else None


def wait_for_owner(pg_dsn: str, schema: str, procs: dict[int, subprocess.Popen], not_pid: int | None,
                   timeout: float = 15) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owner = owner_of(pg_dsn, schema)
        if owner is not None:
            pid = int(owner.rsplit(":", 1)[1])
            if pid in procs and pid != not_pid and procs[pid].poll() is None:
                return pid
        time.sleep(0.1)
    raise AssertionError("no publisher instance took over")


def test_failover_between_three_instances_never_interleaves(pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap)
    with bootstrap(settings) as app:
        stop = threading.Event()
        writer = keep_writing(app, stop, "failover")
        # One bucket: one instance publishes, the others stand by (parallel buckets: test_partitioned_publishing).
        procs = {p.pid: p for p in (publisher_process(pg_dsn, schema, kafka_bootstrap, COMMITLINE_PUBLISH_BUCKETS="1")
                                    for _ in range(3))}
        try:
            first = wait_for_owner(pg_dsn, schema, procs, None)
            wait_for_progress(pg_dsn, schema, beyond=published_position(pg_dsn, schema) + 100)
            procs[first].send_signal(signal.SIGKILL)
            procs[first].wait(10)
            killed_at = time.monotonic()
            second = wait_for_owner(pg_dsn, schema, procs, first)
            takeover = time.monotonic() - killed_at
            wait_for_progress(pg_dsn, schema, beyond=published_position(pg_dsn, schema) + 100)
        finally:
            stop.set()
            writer.join(30)
        wait_for_progress(pg_dsn, schema, beyond=app.recorder.max_notification_id() - 1)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(30)
        survivors = [p for pid, p in procs.items() if pid != first]
        assert all(p.returncode == 0 for p in survivors), [p.stderr.read().decode()[-2000:] for p in survivors]

        expected = stored_events(pg_dsn, schema)
        records = read_topics(kafka_bootstrap, settings.kafka_topic_prefix, len(expected))
        check_stream(records, expected)
        publishers = Counter(r.headers["publisher"].rsplit(":", 1)[1] for r in records)
        assert set(publishers) <= {str(first), str(second)}, "only the owners ever published"
        assert str(first) in publishers and str(second) in publishers
        for (topic, partition), sequence in _publisher_sequences(records).items():
            blocks = [p for i, p in enumerate(sequence) if i == 0 or p != sequence[i - 1]]
            assert len(blocks) == len(set(blocks)), f"{topic}[{partition}] interleaves publishers: {blocks}"
        assert takeover < 5, f"takeover took {takeover:.1f} s"


def published_position(pg_dsn: str, schema: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(
            f"SELECT position FROM {schema}.follower_positions WHERE name = 'kafka-publisher'").fetchone()[0]


def wait_for_progress(pg_dsn: str, schema: str, beyond: int, timeout: float = 60) -> None:
    """Wait until the saved publisher position passes ``beyond``."""
    deadline = time.monotonic() + timeout
    while published_position(pg_dsn, schema) <= beyond:
        assert time.monotonic() < deadline, f"the publisher did not get past position {beyond}"
        time.sleep(0.05)


def _publisher_sequences(records: list[ConsumedRecord]) -> dict[tuple[str, int], list[str]]:
    sequences: dict[tuple[str, int], list[str]] = defaultdict(list)
    for r in records:
        sequences[(r.topic, r.partition)].append(r.headers["publisher"])
    return sequences


def test_a_late_commit_is_published(pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap)
    with bootstrap(settings) as app, FollowerThread(app.publisher) as background:
        late_item = uuid4()
        app.dispatch({"type": "receive_stock", "item_id": str(late_item), "quantity": 1}, idempotency_key="late-0")
        release = threading.Event()
        inserted = threading.Event()

        def hold_commit() -> None:
            app.recorder.before_commit = lambda: (inserted.set(), release.wait(30))
            try:
                app.dispatch({"type": "receive_stock", "item_id": str(late_item), "quantity": 1},
                             idempotency_key="late-1")
            finally:
                app.recorder.before_commit = None

        late = threading.Thread(target=hold_commit)
        late.start()
        assert inserted.wait(10)
        app.recorder.before_commit = None
        others = [app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1},
                               idempotency_key=f"later-{i}") for i in range(5)]
        # The publisher has read the later commits and stopped at the open one (id 2), not passed it.
        # The gap is recorded by the read, before event 1 is acknowledged and its position saved:
        # wait for both, then the position must still be 1 (the later commits were not published).
        deadline = time.monotonic() + 20
        while 2 not in app.recorder.log.gaps_seen() or background.follower.metrics.position < 1:
            assert time.monotonic() < deadline, "the publisher never reached the later commits"
            time.sleep(0.02)
        assert background.follower.metrics.position == 1
        release.set()
        late.join(30)
        background.wait_until_at(app.recorder.max_notification_id())
        expected = stored_events(pg_dsn, schema)
        assert len(expected) == 7 and len(others) == 5
        records = read_topics(kafka_bootstrap, settings.kafka_topic_prefix, 7)
        assert check_stream(records, expected) == 0


def test_a_broker_that_refuses_the_idempotent_producer_stops_publish_naming_the_setting(
        pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="k")
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}.",
           "COMMITLINE_KAFKA_IDEMPOTENCE": "true"}  # the embedded broker cannot run it
    done = subprocess.run([sys.executable, "-m", "commitline.cli", "publish"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-3000:]
    error = orjson.loads(done.stderr.strip().splitlines()[-1])
    assert error["code"] == "configuration_error" and error["details"]["variable"] == "COMMITLINE_KAFKA_IDEMPOTENCE"
    assert "COMMITLINE_KAFKA_IDEMPOTENCE=false" in error["message"]


def test_an_unknown_sslmode_is_a_configuration_error_naming_the_variable(pg_dsn: str) -> None:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn + "?sslmode=bogus"}
    done = subprocess.run([sys.executable, "-m", "commitline.cli", "status"], env=env, capture_output=True,
                          text=True, timeout=120)
    error = orjson.loads(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 3 and error["code"] == "configuration_error", done.stderr
    assert error["details"]["variable"] == "COMMITLINE_DATABASE_URL" and "sslmode=bogus" in error["message"]


def test_every_follower_counts_its_retried_attempts_in_its_metrics(pg_dsn: str, schema: str) -> None:
    """``commitline_follower_errors_total``: the publisher's attempts against a broker that is down, counted as
    they fail; a projector exposes the counter too (at 0 while nothing failed)."""
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from commitline.infrastructure.metrics import FollowerCollector

    settings = settings_for(pg_dsn, schema, kafka_bootstrap_servers="127.0.0.1:1", kafka_idempotence=False)
    with bootstrap(settings) as app:
        writer_workload(app, writers=1, commands_each=2, tag="down")
        with FollowerThread(app.publisher) as publisher, FollowerThread(lambda: app.projector("payment_states")) as \
                projector:
            projector.wait_until_at(app.recorder.max_notification_id() or 0)
            wait_for(lambda: publisher.follower.failed_attempts >= 2, "two failed attempts against the broker")
            registry = CollectorRegistry()
            registry.register(FollowerCollector([publisher.follower, projector.follower]))
            text = generate_latest(registry).decode()
    counted = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("commitline_follower_errors_total{")}
    assert counted['follower="kafka-publisher"'] >= 2 and counted['follower="payment_states"'] == 0, text
