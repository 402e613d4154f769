"""Large commands: stored as events below the size limit, appended without stalls, published
within the broker's message limit, and a record the broker cannot take stops the publisher
for an operator instead of being retried forever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from uuid import uuid4

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent

from commitline.application.errors import EventTooLarge
from commitline.composition import Commitline, bootstrap
from commitline.examples.surveys import MAX_USERS_PER_ISSUE
from commitline.infrastructure.kafka.producer import record_size
from commitline.infrastructure.store.event_store import PostgresEventStore
from tests.integration.test_projections import projector
from tests.support import FollowerThread, count_rows, kafka_settings, read_topics, settings_for, wait_for

KAFKA_DEFAULT_MESSAGE_MAX_BYTES = 1_048_588


def stored_sizes(dsn: str, schema: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f'SELECT topic, octet_length(state) FROM "{schema}".events ORDER BY notification_id').fetchall()


def issue(app: Commitline, task_id: object, user_ids: list[str], key: str) -> object:
    return app.dispatch({"type": "issue_survey_task", "task_id": str(task_id), "user_ids": user_ids},
                        idempotency_key=key)


def test_an_append_larger_than_the_socket_buffers_completes_while_the_server_pauses(pg_dsn: str,
                                                                                      schema: str) -> None:
    # psycopg's pipeline stops flushing once its last command is queued: with a server reading slowly, what
    # the kernel's socket buffers had not taken by then was never sent, and the append hung (64 MB: more than
    # this machine's socket buffers can hold, 36 MB).
    with bootstrap(settings_for(pg_dsn, schema, pool_size=1, pool_max_overflow=0)) as app:
        with app.datastore.connection() as conn:
            backend = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        try:
            os.kill(backend, 0)
        except OSError as e:
            pytest.fail(f"this test pauses the PostgreSQL backend, which must run on this machine: {e}")
        event = StoredEvent(uuid4(), 1, "SurveyTaskIssued", b"x" * (64 * 1024 * 1024))
        done = threading.Event()
        appended: list[list[int]] = []

        def append() -> None:
            appended.append(app.recorder.append([event]))
            done.set()

        threading.Thread(target=append, daemon=True).start()
        try:  # a slow reader: the server runs 1 ms in 10 until the append is through (or clearly stuck)
            for _ in range(2000):
                os.kill(backend, signal.SIGSTOP)
                if done.wait(0.009):
                    break
                os.kill(backend, signal.SIGCONT)
                time.sleep(0.001)
        finally:
            os.kill(backend, signal.SIGCONT)
        if not done.wait(120):
            with psycopg.connect(pg_dsn, autocommit=True) as other:  # end it, or its open transaction blocks teardown
                other.execute("SELECT pg_terminate_backend(%s)", (backend,))
            pytest.fail("the append stalled with its transaction open after the server resumed")
        assert len(appended[0]) == 1
        assert app.recorder.select_notifications(1, 10)[0].originator_id == event.originator_id


def test_issue_to_100000_users_five_times_is_stored_published_and_projected(pg_dsn: str, schema: str,
                                                                             kafka_bootstrap: str) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, kafka_max_message_bytes=KAFKA_DEFAULT_MESSAGE_MAX_BYTES)
    rounds = 5
    with bootstrap(settings) as app:
        tasks = []
        for n in range(rounds):
            task_id = app.dispatch({"type": "create_survey_task", "title": f"big {n}"},
                                   idempotency_key=f"create-{n}").aggregate_id
            users = [f"{n}-{i:0126d}" for i in range(MAX_USERS_PER_ISSUE)]
            result = issue(app, task_id, users, f"issue-{n}")
            parts = result.events  # type: ignore[attr-defined]
            assert len(parts) > 1 and {e.payload["parts"] for e in parts} == {len(parts)}
            assert [u for e in parts for u in e.payload["user_ids"]] == users
            tasks.append(task_id)

        sizes = stored_sizes(pg_dsn, schema)
        assert max(size for _, size in sizes) <= settings.max_event_bytes
        assert sum(1 for topic, _ in sizes if topic == "SurveyTaskIssued") == len(parts) * rounds

        head = app.recorder.max_notification_id()
        with FollowerThread(app.publisher) as publisher, projector(app, "task_statuses") as projecting:
            publisher.wait_until_at(head, timeout=300)
            projecting.wait_until_at(head, timeout=300)
        for task_id in tasks:
            assert app.read_models().task_counts(task_id) == {"PENDING": MAX_USERS_PER_ISSUE, "DONE": 0}

        records = read_topics(kafka_bootstrap, settings.kafka_topic_prefix, len(sizes), timeout=120)
        published: dict[str, set[str]] = defaultdict(set)
        for r in records:
            assert len(r.envelope["payload"].get("user_ids", ())) < MAX_USERS_PER_ISSUE
            published[r.envelope["aggregate_id"]].update(r.envelope["payload"].get("user_ids", ()))
        assert {str(t): len(published[str(t)]) for t in tasks} == {str(t): MAX_USERS_PER_ISSUE for t in tasks}
        largest = max(records, key=lambda r: len(json.dumps(r.envelope)))
        assert record_size_of(largest) <= KAFKA_DEFAULT_MESSAGE_MAX_BYTES


def record_size_of(record: object) -> int:
    from commitline.infrastructure.kafka.envelope import KafkaRecord

    value = json.dumps(record.envelope, separators=(",", ":")).encode()  # type: ignore[attr-defined]
    headers = [(k, v.encode()) for k, v in record.headers.items()]  # type: ignore[attr-defined]
    return record_size(KafkaRecord("", record.key.encode(), value, headers, 0, 0, ""))  # type: ignore[attr-defined]


def test_an_event_above_the_limit_is_refused_and_nothing_is_written(app: Commitline, pg_dsn: str,
                                                                     schema: str) -> None:
    app.processor.store = PostgresEventStore(app.recorder, app.codec, max_event_bytes=100_000)  # below any command's events
    task_id = app.dispatch({"type": "create_survey_task", "title": "t"}, idempotency_key="create").aggregate_id
    before = count_rows(pg_dsn, schema)
    with pytest.raises(EventTooLarge) as refused:
        issue(app, task_id, [f"{i:0128d}" for i in range(2_000)], "too-large")
    assert refused.value.details() == {"command_type": "issue_survey_task", "event_type": "SurveyTaskIssued",
                                       "size": refused.value.size, "limit": 100_000}
    assert refused.value.size > 100_000
    assert count_rows(pg_dsn, schema) == before
    assert issue(app, task_id, ["u1"], "small").version == 2  # nothing of the refused command was kept


def cli(pg_dsn: str, schema: str, bootstrap_servers: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
                   "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers, "COMMITLINE_KAFKA_IDEMPOTENCE": "false",
                   "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}.", "COMMITLINE_PUBLISH_POLL_INTERVAL_MS": "200", **env}
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], env=environment, capture_output=True,
                          text=True, timeout=180)


def publisher_row(pg_dsn: str, schema: str, bootstrap_servers: str) -> dict:
    status = cli(pg_dsn, schema, bootstrap_servers, "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    return next(f for f in json.loads(status.stdout)["followers"] if f["name"] == "kafka-publisher")


def test_a_record_above_the_broker_limit_stops_the_publisher_until_an_operator_decides(
    app: Commitline, pg_dsn: str, schema: str, kafka_bootstrap: str
) -> None:
    small_limit = {"COMMITLINE_KAFKA_MAX_MESSAGE_BYTES": "100000"}
    task_id = app.dispatch({"type": "create_survey_task", "title": "t"}, idempotency_key="create").aggregate_id
    parts = issue(app, task_id, [f"{i:040d}" for i in range(10_000)], "big").events  # type: ignore[attr-defined]
    assert len(parts) == 2  # both above 100,000 bytes
    app.dispatch({"type": "close_survey_task", "task_id": str(task_id)}, idempotency_key="close")
    first, second = 2, 3  # positions of the two parts, after the creation at 1

    # A long-running publisher (no --drain) stopped at it, then by SIGTERM, exits 0 as documented (a supervisor
    # restarting it is not told of a crash); the stop is logged and kept. A drain then exits 1: it cannot finish.
    environment = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
                   "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "COMMITLINE_KAFKA_IDEMPOTENCE": "false",
                   "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}.", "COMMITLINE_LOG_LEVEL": "INFO", **small_limit}
    with tempfile.TemporaryFile("w+") as log:
        running = subprocess.Popen([sys.executable, "-m", "commitline.cli", "publish"], env=environment,
                                   stdout=subprocess.DEVNULL, stderr=log, text=True)
        try:
            wait_for(lambda: log.seek(0) == 0 and "stopped at poison event" in log.read(),
                     "the publisher to stop at the first part", timeout=120)
            running.send_signal(signal.SIGTERM)
            assert running.wait(timeout=120) == 0
        finally:
            if running.poll() is None:
                running.kill()
                running.wait()
        log.seek(0)
        logged = log.read()
        assert "stopped at a poison record" in logged
        assert "COMMITLINE_MAX_EVENT_BYTES (900000) lets the store take events whose Kafka records" in logged

    drained = cli(pg_dsn, schema, kafka_bootstrap, "publish", "--drain", **small_limit)
    assert drained.returncode == 1 and "poison record" in drained.stderr, drained.stderr[-3000:]
    row = publisher_row(pg_dsn, schema, kafka_bootstrap)
    assert (row["status"], row["position"], row["error"]["position"]) == ("failed", 1, first)
    assert "larger than the broker's limit of 100000 bytes" in row["error"]["message"]

    wrong = cli(pg_dsn, schema, kafka_bootstrap, "publisher", "skip", "--position", str(second))
    assert wrong.returncode == 1 and f"stopped at position {first}" in wrong.stderr
    skipped = cli(pg_dsn, schema, kafka_bootstrap, "publisher", "skip", "--position", str(first),
                  "--reason", "part re-sent by hand")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    again = cli(pg_dsn, schema, kafka_bootstrap, "publish", "--drain", "--json", **small_limit)
    assert again.returncode == 1
    stopped = json.loads(again.stdout)
    assert (stopped["stopped_at_poison"], stopped["store_went_back"]) == (True, False)
    assert publisher_row(pg_dsn, schema, kafka_bootstrap)["error"]["position"] == second

    retried = cli(pg_dsn, schema, kafka_bootstrap, "publisher", "retry", "--json")
    assert retried.returncode == 0, retried.stderr[-3000:]
    said = json.loads(retried.stdout)  # the event retried, as the message says it
    assert (said["action"], said["position"], said["positions"]) == ("retry", second, [second])
    assert f"position {second}" in said["message"]
    finished = cli(pg_dsn, schema, kafka_bootstrap, "publish", "--drain")  # the default, 1 MB limit
    assert finished.returncode == 0, finished.stderr[-3000:]
    row = publisher_row(pg_dsn, schema, kafka_bootstrap)
    assert (row["status"], row["position"], row["error"]) == ("stopped", 4, None)

    records = read_topics(kafka_bootstrap, f"{schema}.", 3)
    assert [(r.envelope["type"], r.envelope["version"]) for r in records] == [
        ("SurveyTaskCreated", 1), ("SurveyTaskIssued", 3), ("SurveyTaskClosed", 4)]
