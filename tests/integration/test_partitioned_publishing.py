"""Several ``commitline publish`` processes sharing the buckets, against a real broker, read back with an
independent Kafka client (confluent-kafka, i.e. librdkafka: not the aiokafka the publisher uses)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from uuid import uuid4

import orjson
import psycopg
import pytest

from commitline.composition import Commitline, bootstrap
from tests.support import AGGREGATES
from commitline.infrastructure.followers.group_status import GroupStatus, group_status
from commitline.infrastructure.kafka.envelope import topic_for
from commitline.infrastructure.kafka.publisher import Publisher
from commitline.infrastructure.kafka.publisher import PUBLISHER
from commitline.infrastructure.store.log import BucketLog, BucketPage, bucket_of
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.http.status_page import status_document
from tests.kafka_reader import read_topics
from tests.support import FollowerThread, kafka_settings, wait_for

BUCKETS = 16


def publish_process(pg_dsn: str, schema: str, bootstrap_servers: str) -> subprocess.Popen:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers, "COMMITLINE_KAFKA_IDEMPOTENCE": "false",
           "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}.", "COMMITLINE_KAFKA_PARTITIONS": "4",
           "COMMITLINE_PUBLISH_BUCKETS": str(BUCKETS), "COMMITLINE_PUBLISH_BATCH_SIZE": "100",
           "COMMITLINE_PUBLISH_POLL_INTERVAL_MS": "200"}
    return subprocess.Popen([sys.executable, "-m", "commitline.cli", "publish"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def group(app: Commitline) -> GroupStatus:
    return group_status(app.recorder, PUBLISHER, BUCKETS, app.recorder.max_notification_id() or 0)


def shares(app: Commitline) -> dict[int, int]:
    """Live instance (backend pid) -> buckets it owns; {} unless every bucket has a live owner."""
    g = group(app)
    return {} if g.unowned else {m.backend.pid: len(m.buckets) for m in g.members}


def bucket_positions(pg_dsn: str, schema: str) -> list[int]:
    with psycopg.connect(pg_dsn) as conn:
        rows = dict(conn.execute(f"SELECT name, position FROM {schema}.follower_positions "
                                 "WHERE starts_with(name, %s)", (f"{PUBLISHER}/",)).fetchall())
    return [rows.get(f"{PUBLISHER}/{b:02d}of{BUCKETS}", 0) for b in range(BUCKETS)]


def stored_events(pg_dsn: str, schema: str) -> dict[str, tuple[str, int]]:
    """event id -> (aggregate id, version), straight from the store."""
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT originator_id, originator_version, state FROM {schema}.events").fetchall()
    return {orjson.loads(bytes(s))["id"]: (str(a), v) for a, v, s in rows}


def consume_everything(bootstrap_servers: str, prefix: str,
                       aggregates: Sequence[type] = AGGREGATES) -> list[tuple[str, int, int, dict]]:
    """(topic, partition, offset, envelope) of every record of the prefix's topics (of ``aggregates``, by default
    the examples'), each partition read from its beginning to its end (``tests/kafka_reader.py``); the envelope
    also says who sent it (``_publisher``)."""
    records = []
    for r in read_topics(bootstrap_servers, [topic_for(prefix, a.__name__) for a in aggregates]):
        envelope = orjson.loads(r.value)
        envelope["_publisher"] = r.headers.get("publisher", b"?").decode()
        assert r.key.decode() == envelope["aggregate_id"], "key = aggregate id"
        records.append((r.topic, r.partition, r.offset, envelope))
    return records


def keep_writing(app: Commitline, stop: threading.Event, tag: str, written: list[int]) -> threading.Thread:
    shared = [str(uuid4()) for _ in range(3)]

    def write() -> None:
        own = [str(uuid4()) for _ in range(4)]
        n = 0
        while not stop.is_set():
            item = shared[n % 3] if n % 7 == 0 else own[n % 4]  # contended streams leave gaps in the log
            app.dispatch({"type": "receive_stock", "item_id": item, "quantity": 1}, idempotency_key=f"{tag}-{n}")
            n += 1
        written.append(n)

    thread = threading.Thread(target=write, name=tag)
    thread.start()
    return thread


def test_three_instances_killed_at_random_lose_and_reorder_nothing(
    pg_dsn: str, schema: str, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=BUCKETS)
    with bootstrap(settings) as app, bootstrap(settings) as late_app:
        # The second app's writers hold every commit open for a while after their ids were drawn: later ids of
        # the other writers commit first, and a publisher that passed the gap would never publish these.
        late_app.recorder.before_commit = lambda: time.sleep(random.uniform(0.05, 0.5))
        stop, written = threading.Event(), []
        writers = [keep_writing(late_app if i < 4 else app, stop, f"w{i}", written) for i in range(20)]
        procs = [publish_process(pg_dsn, schema, kafka_bootstrap) for _ in range(3)]
        kills = 0
        try:
            wait_for(lambda: len(group(app).members) == 3, "three publish instances", timeout=60)
            while kills < 12:
                # Kill at a random moment of progress: once the lowest bucket position moved past a random
                # number of events beyond where it was at the last kill.
                watermark = min(bucket_positions(pg_dsn, schema))
                step = random.randint(5, 150)
                wait_for(lambda: min(bucket_positions(pg_dsn, schema)) > watermark + step,
                         "the buckets to move on", timeout=60)
                victim = random.randrange(len(procs))
                assert procs[victim].poll() is None, procs[victim].stderr.read().decode()[-3000:]
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait(10)
                kills += 1
                procs[victim] = publish_process(pg_dsn, schema, kafka_bootstrap)
        finally:
            stop.set()
            for writer in writers:
                writer.join(60)
        head = app.recorder.max_notification_id()
        wait_for(lambda: min(bucket_positions(pg_dsn, schema)) >= head, "every bucket to publish the head", 120)
        # The last instance restarted may still be taking its share: wait until the group settled.
        wait_for(lambda: sorted(shares(app).values()) == [5, 5, 6], "every bucket owned, shared fairly", timeout=30)

        status = subprocess.run([sys.executable, "-m", "commitline.cli", "status", "--json"], capture_output=True,
                                text=True, timeout=60, env={**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn,
                                                            "COMMITLINE_SCHEMA": schema,
                                                            "COMMITLINE_PUBLISH_BUCKETS": str(BUCKETS)})
        publisher = json.loads(status.stdout)["publisher"]
        live = {p.pid for p in procs}
        instances = {i["pid"]: i for i in publisher["instances"]}
        assert len(instances) == 3 and publisher["unowned"] == []
        assert sorted(b for i in instances.values() for b in i["buckets"]) == list(range(BUCKETS)), \
            "each bucket owned by exactly one instance"
        assert {i["owner"].rsplit(":", 1)[1] for i in instances.values()} == {str(p) for p in live}, \
            "the owners are the live processes"

        expected = stored_events(pg_dsn, schema)
        records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(60) == 0, proc.stderr.read().decode()[-3000:]

    seen: set[str] = set()
    duplicates = 0
    last_version: dict[str, int] = {}
    partitions_of: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for topic, partition, _, envelope in records:  # in the order a consumer of each partition reads them
        aggregate, version = envelope["aggregate_id"], envelope["version"]
        partitions_of[aggregate].add((topic, partition))
        if envelope["event_id"] in seen:
            duplicates += 1  # sent again by a new owner after a kill: at-least-once
            continue
        seen.add(envelope["event_id"])
        assert version == last_version.get(aggregate, 0) + 1, \
            f"aggregate {aggregate}: version {version} first read after {last_version.get(aggregate, 0)}\n" \
            + history(aggregate, records, expected)
        last_version[aggregate] = version
    missing = set(expected) - seen
    with capsys.disabled():
        print(f"\n[partitioned publishers] {kills} SIGKILLs, {len(expected)} events ({sum(written)} commands), "
              f"{duplicates} duplicates, {len(missing)} missing")
    assert not missing and seen == set(expected)
    assert all(len(p) == 1 for p in partitions_of.values()), "an aggregate's records share one partition"
    assert len({bucket_of(uuid.UUID(a), BUCKETS) for a in last_version}) == BUCKETS, "the workload spans every bucket"
    assert kills >= 10


def history(aggregate: str, records: Sequence[tuple[str, int, int, dict]],
            expected: Mapping[str, tuple[str, int]]) -> str:
    """What a failed ordering check needs to tell a broker's fault from a publisher's: every record of the
    aggregate where it was read, who sent it, and which of its stored versions Kafka lacks."""
    lines = [f"  {topic}[{partition}]@{offset}: v{e['version']} (notification {e['notification_id']}, "
             f"sent by {e['_publisher']})" for topic, partition, offset, e in records if e["aggregate_id"] == aggregate]
    stored = sorted(v for a, v in expected.values() if a == aggregate)
    read = {e["version"] for *_, e in records if e["aggregate_id"] == aggregate}
    return "\n".join([*lines, f"  stored versions {stored}; not in Kafka: {sorted(set(stored) - read)}"])


def test_buckets_are_shared_fairly_and_rebalanced_when_instances_leave_and_join(
    pg_dsn: str, schema: str, kafka_bootstrap: str
) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=BUCKETS)
    with bootstrap(settings) as app:
        procs = [publish_process(pg_dsn, schema, kafka_bootstrap) for _ in range(3)]
        try:
            wait_for(lambda: sorted(shares(app).values()) == [5, 5, 6], "three instances owning 5, 5 and 6 buckets",
                     timeout=30)
            assert {m.owner.rsplit(":", 1)[1] for m in group(app).members} == {str(p.pid) for p in procs}

            procs[0].send_signal(signal.SIGTERM)
            assert procs[0].wait(30) == 0, procs[0].stderr.read().decode()[-3000:]
            wait_for(lambda: sorted(shares(app).values()) == [8, 8], "the other two taking its buckets", timeout=10)

            procs[1].send_signal(signal.SIGKILL)  # dies without letting go: its session's locks vanish
            procs[1].wait(10)
            wait_for(lambda: sorted(shares(app).values()) == [16], "the last one taking every bucket", timeout=10)

            procs[0] = publish_process(pg_dsn, schema, kafka_bootstrap)
            procs[1] = publish_process(pg_dsn, schema, kafka_bootstrap)
            wait_for(lambda: sorted(shares(app).values()) == [5, 5, 6], "newcomers taking their share", timeout=30)
            for n in range(20):  # and they publish
                app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1},
                             idempotency_key=f"after-{n}")
            head = app.recorder.max_notification_id()
            wait_for(lambda: min(bucket_positions(pg_dsn, schema)) >= head, "every bucket to publish the head", 30)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(60)
        assert [p.returncode for p in procs] == [0, 0, 0], [p.stderr.read().decode()[-2000:] for p in procs]


class HeldLog(BucketLog):
    """The bucket log, whose ``hold_at``-th read waits until ``release`` is set."""

    def __init__(self, recorder: EventRecorder, buckets: int, hold_at: int):
        super().__init__(recorder, buckets)
        self.reads, self.hold_at = 0, hold_at
        self.holding, self.release = threading.Event(), threading.Event()

    def read(self, positions: Mapping[int, int], limit: int) -> BucketPage:
        self.reads += 1
        if self.reads == self.hold_at:
            self.holding.set()
            assert self.release.wait(60)
        return super().read(positions, limit)


def test_buckets_handed_over_in_the_middle_of_a_round_are_published_once_in_order(
    pg_dsn: str, schema: str, kafka_bootstrap: str
) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=BUCKETS, publish_batch_size=50)
    with bootstrap(settings) as app:
        items = [str(uuid4()) for _ in range(40)]
        for n in range(400):
            app.dispatch({"type": "receive_stock", "item_id": items[n % 40], "quantity": 1}, idempotency_key=f"a{n}")
        first_log = HeldLog(app.recorder, BUCKETS, hold_at=4)

        def first_instance() -> Publisher:
            publisher = app.publisher(settings, owner="first")
            publisher.log = first_log
            return publisher

        with FollowerThread(first_instance) as first:
            # The first instance owns every bucket and is in the middle of publishing them (a read held) when
            # the second joins: it hands over half of them only once that round is sent and saved.
            assert first_log.holding.wait(60)
            assert len(first.follower.owned) == BUCKETS
            with FollowerThread(lambda: app.publisher(settings, owner="second")) as second:
                wait_for(lambda: len(group(app).members) == 2, "the second instance to join", timeout=30)
                first_log.release.set()
                wait_for(lambda: sorted(shares(app).values()) == [8, 8], "the buckets shared 8 and 8", timeout=30)
                assert first.follower.metrics.events_published > 0
                for n in range(200):
                    app.dispatch({"type": "receive_stock", "item_id": items[n % 40], "quantity": 1},
                                 idempotency_key=f"b{n}")
                head = app.recorder.max_notification_id()
                wait_for(lambda: min(bucket_positions(pg_dsn, schema)) >= head, "every bucket to publish the head",
                         timeout=60)
                published = first.follower.metrics.events_published + second.follower.metrics.events_published
                assert second.follower.metrics.events_published > 0
    assert published == 600, "a bucket handed over between two rounds is sent again by nobody"
    expected = stored_events(pg_dsn, schema)
    records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix)
    assert sorted(r[3]["event_id"] for r in records) == sorted(expected), "every event exactly once"
    last_version: dict[str, int] = {}
    for _, _, _, envelope in records:  # each partition in offset order
        aggregate = envelope["aggregate_id"]
        assert envelope["version"] == last_version.get(aggregate, 0) + 1, f"{aggregate} out of order"
        last_version[aggregate] = envelope["version"]


def test_status_names_the_owning_process_and_tells_a_dead_instance_once(pg_dsn: str, schema: str,
                                                                         kafka_bootstrap: str) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=BUCKETS)
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "COMMITLINE_PUBLISH_BUCKETS": str(BUCKETS)}
    with bootstrap(settings) as app:
        app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="k")
        proc = publish_process(pg_dsn, schema, kafka_bootstrap)
        try:
            wait_for(lambda: sorted(shares(app).values()) == [BUCKETS], "the instance to own every bucket", 60)
            report = json.loads(subprocess.run([sys.executable, "-m", "commitline.cli", "status", "--json"], env=env,
                                               capture_output=True, text=True, timeout=60).stdout)
            (instance,) = report["publisher"]["instances"]
            process = instance["process"]
            assert (process["pid"], process["kind"]) == (proc.pid, "publish") and process["host"]
            assert process["started_at"] and instance["pid"] != proc.pid, "pid is the PostgreSQL session's"
            buckets = {b["name"]: b for b in report["publisher"]["buckets"]}
            assert all(b["process"]["pid"] == proc.pid for b in buckets.values())
            (publisher,) = [f for f in report["followers"] if f["name"] == PUBLISHER]
            assert f":{proc.pid} (publish, started" in publisher["owned_by"], publisher
            (shown,) = [f for f in status_document(app)["followers"] if f["name"] == PUBLISHER]  # the status page's
            assert shown["alive"] and f":{proc.pid} (publish, started" in shown["owned_by"], shown
            table = subprocess.run([sys.executable, "-m", "commitline.cli", "status"], env=env, capture_output=True,
                                   text=True, timeout=60).stdout
            assert f":{proc.pid} (publish, started" in table
            (row,) = [line for line in table.splitlines() if f" {PUBLISHER} " in line]
            assert f":{proc.pid} (publish" in row and "(last)" not in row, row  # its live instance, not a past owner
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    checked = subprocess.run([sys.executable, "-m", "commitline.cli", "status", "--check", "publisher"], env=env,
                             capture_output=True, text=True, timeout=60)
    lines = checked.stderr.strip().splitlines()
    assert checked.returncode == 1 and len(lines) == 1, checked.stderr
    assert lines[0].startswith(f"unhealthy: {PUBLISHER} instance ") and ":" + str(proc.pid) in lines[0]
    assert "dead: no live session holds its lease" in lines[0] and lines[0].endswith(f"(buckets 0-{BUCKETS - 1})")


def test_a_bucket_count_changed_and_back_sends_nothing_again(pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    """COMMITLINE_PUBLISH_BUCKETS 16, then 4, then 16 again: the 16 buckets' rows from the first time are behind
    what the 4 published since; they go on from the publisher's position (what every bucket of the 4 published),
    not from their own, so nothing the 4 sent is sent again (nor anything lost)."""
    items = [str(uuid4()) for _ in range(30)]
    with bootstrap(kafka_settings(pg_dsn, schema, kafka_bootstrap)) as app:
        for count, tag in ((16, "a"), (4, "b"), (16, "c")):
            for n in range(150):
                app.dispatch({"type": "receive_stock", "item_id": items[n % 30], "quantity": 1},
                             idempotency_key=f"{tag}{n}")
            settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=count)
            assert app.run_until_signalled(app.publisher(settings, owner=f"{count}{tag}"), drain=True)
    expected = stored_events(pg_dsn, schema)
    records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix)
    sent = [r[3]["event_id"] for r in records]
    assert len(sent) == len(expected) == 450 and set(sent) == set(expected), (
        f"{len(sent) - len(set(sent))} records sent again")


def test_status_reads_the_publishers_position_and_lag_from_its_buckets(pg_dsn: str, schema: str,
                                                                      kafka_bootstrap: str) -> None:
    """The publisher's own row sums its buckets up, written by the owner of bucket 0; a kill -9 of that owner
    leaves it behind its buckets until the next owner writes it. Status reads the buckets, not that row, so it
    does not report events waiting that every bucket has published."""
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=BUCKETS, status_max_lag_events=5)
    with bootstrap(settings) as app:
        for n in range(20):
            app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key=f"k{n}")
        assert app.run_until_signalled(app.publisher(), drain=True)
        head = app.recorder.max_notification_id()
        assert min(bucket_positions(pg_dsn, schema)) == head
        with psycopg.connect(pg_dsn) as conn:  # the row as a kill -9 of bucket 0's owner leaves it
            conn.execute(f"UPDATE {schema}.follower_positions SET position = 3 WHERE name = %s", (PUBLISHER,))
        report = app.status()
        (row,) = [s for s in report.followers if s.name == PUBLISHER]
        assert (row.position, row.lag_events, row.lag_seconds) == (head, 0, 0.0)
        assert not [p for p in report.problems() if PUBLISHER in p.subject], report.problems()


def test_status_shows_the_bucket_count_the_running_instances_use_not_its_own_setting(
        pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    """After COMMITLINE_PUBLISH_BUCKETS changed for the publishers (16 to 4), a status read with the old setting
    (an operator's shell, a serve not restarted) showed 16 buckets owned by nobody, and /metrics every bucket
    dead, while the 4 published fine: it reads the count the instances use, live or last written."""
    four = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=4)
    with bootstrap(kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=BUCKETS)) as app:
        assert app.status().publisher.bucket_count == BUCKETS  # nothing ran yet: its own setting
        for n in range(20):
            app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key=f"k{n}")
        with FollowerThread(lambda: app.publisher(four, owner="four")):
            running = wait_for(lambda: (lambda g: g if g.bucket_count == 4 and not g.unowned and g.members else None)(
                app.status().publisher), "status to show the 4 buckets the running instance owns")
            assert [m.buckets for m in running.members] == [[0, 1, 2, 3]]
            assert not [p for p in app.status().problems() if PUBLISHER in p.subject and "unowned" in p.reason]
        stopped = app.status().publisher
        assert stopped.bucket_count == 4 and {b.status for b in stopped.buckets} == {"stopped"}
