"""Failover to an ASYNCHRONOUS standby held behind, under a running fleet of real processes and load over HTTP.

The standby (``pg_basebackup -R``, no ``synchronous_standby_names``) streams from the primary; its WAL receiver
is paused with SIGSTOP while ``serve`` acknowledges commands and two ``publish`` instances send their events to
Kafka, so that both pile up beyond what the standby has. Then the primary is SIGKILLed, the receiver too (a
SIGCONT would let it read what its socket still buffers), and the standby promoted: acknowledged commands are
lost, and Kafka holds records of events the new primary lacks under notification ids it will hand out again.

What docs/guides/failover.md promises of that, checked from the tables and an independent Kafka consumer:
streams on the new primary are whole (a ``serve`` with stale cached aggregates cannot write past lost history)
and the audit verifies; the publishers stop with ``store_went_back`` before publishing another event under a
notification id Kafka holds; the operator's procedure (``store new-generation``, ``followers reset``) lets every
follower go on, the publisher in generation 2; every stored event is then in Kafka, and the void records of
generation 1 are told apart by their envelope alone; unacknowledged commands retried with their key apply once
and the read models equal a recount.

The new head at promotion is read before anything else writes there: the standby is given
``default_transaction_read_only = on`` before its promotion, which a URL with ``target_session_attrs=read-write``
refuses, and it is cleared once the head is read (a few milliseconds).

Marked ``failover`` so that it can be run alone, e.g. three times in a row:
``for i in 1 2 3; do pytest -m failover tests/integration/test_fleet_async_failover.py || break; done``.
"""

from __future__ import annotations

import copy
import os
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from commitline.composition import bootstrap
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.kafka.publisher import PUBLISHER
from tests.fleet import Fleet, Load, check_applied_once, check_kafka, fleet_env, published_beyond, read_kafka
from tests.fleet_workload import (SETTLED, TENANT, Workload, all_running, caught_up, check_each_applied_once,
                                  check_read_models, start_fleet)
from tests.standby import DATABASE, fleet_url, primary_and_standby, promote, sql
from tests.support import settings_for, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.failover]

SCHEMA = "asyncfailover"
HELD_BEHIND = 150  # how many notification ids the publisher must have published beyond the standby's head


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    with primary_and_standby(tmp_path, synchronous=False) as both:
        yield both


def query(dsn: str, statement: str, *params: Any) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True, options="-c default_transaction_read_only=off") as conn:
        cursor = conn.execute(statement.format(schema=SCHEMA), params)
        return cursor.fetchall() if cursor.description else []


def set_read_only(pg: EmbeddedPostgres, on: bool) -> None:
    """New sessions read-only by default (on) or not (off); a read-write URL refuses the server while on."""
    dsn = pg.dsn_for("postgres")
    query(dsn, "ALTER SYSTEM SET default_transaction_read_only = on" if on
          else "ALTER SYSTEM RESET default_transaction_read_only")
    query(dsn, "SELECT pg_reload_conf()")


def follower_rows(dsn: str) -> dict[str, tuple[int, str, dict | None, int]]:
    """name -> (position, status, error, generation) of every follower row."""
    return {n: (p, s, e, g) for n, p, s, e, g in query(
        dsn, "SELECT name, position, status, error, generation FROM {schema}.follower_positions")}


def went_back(row: tuple[int, str, dict | None, int]) -> bool:
    return row[1] == "failed" and (row[2] or {}).get("kind") == "store_went_back"


def bucket_rows(dsn: str) -> dict[str, tuple[int, str, dict | None, int]]:
    return {n: r for n, r in follower_rows(dsn).items() if n.startswith(f"{PUBLISHER}/")}


def stored(dsn: str) -> dict[int, str]:
    """notification id -> event id, from the store."""
    return {n: orjson.loads(bytes(s))["id"] for n, s in query(dsn, "SELECT notification_id, state FROM {schema}.events")}


def one_event_per_id(records: list[dict[str, Any]], generation: int) -> dict[int, str]:
    """notification id -> event id over the records of ``generation``; fails on an id carrying two events."""
    seen: dict[int, set[str]] = defaultdict(set)
    for r in records:
        if int(r.get("generation", 1)) == generation:
            seen[int(r["notification_id"])].add(r["event_id"])
    reused = {n: ids for n, ids in seen.items() if len(ids) > 1}
    assert not reused, f"notification ids carrying two events in generation {generation}: {sorted(reused)[:10]}"
    return {n: next(iter(ids)) for n, ids in seen.items()}


def receiver_pid(standby: EmbeddedPostgres) -> int:
    rows = wait_for(lambda: sql(standby, "SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'"),
                    "the standby's WAL receiver")
    return int(rows[0][0])


def standby_head(standby: EmbeddedPostgres) -> int:
    return int(sql(standby, f"SELECT coalesce(max(notification_id), 0) FROM {SCHEMA}.events", DATABASE)[0][0])


@pytest.mark.timeout(1500)
def test_failover_to_an_asynchronous_standby_held_behind_loses_acknowledged_commands_and_reuses_no_published_id(
        servers: tuple[EmbeddedPostgres, EmbeddedPostgres], kafka_bootstrap: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    primary, standby = servers
    new = standby.dsn_for(DATABASE)
    work = Workload(threads=3)
    with Fleet(fleet_env(fleet_url(primary, standby), SCHEMA, kafka_bootstrap), tmp_path / "logs") as fleet, \
            ExitStack() as stack:
        key = start_fleet(fleet)
        app = stack.enter_context(bootstrap(settings_for(fleet_url(primary, standby), SCHEMA, pool_timeout_s=2)))
        wait_for(lambda: all_running(app), "every follower to run", timeout=180)
        with Load(fleet.base_url, key, work, threads=3) as load:
            load.wait_acked(60, "the load to run")
            # hold the standby behind: its receiver paused while commands are acknowledged and published
            receiver = receiver_pid(standby)
            os.kill(receiver, signal.SIGSTOP)
            held = standby_head(standby)
            load.wait_acked(100, "commands acknowledged while the standby is held behind")
            wait_for(lambda: published_beyond(primary.dsn, SCHEMA, held + HELD_BEHIND),
                     "the publisher to publish beyond what the standby has", timeout=180)
            set_read_only(standby, True)  # the promoted server refuses the fleet until its head is read
            killed_at = time.monotonic()
            primary.kill()
            os.kill(receiver, signal.SIGKILL)  # its socket's buffer goes with it (the standby restarts its processes)
            wait_for(lambda: [s for s in load.failed() if s.failures], "a command refused without a primary", 60)
            wait_for(lambda: _answers(standby), "the standby to answer again after its receiver was killed", 120)
            # acknowledged by the old primary (it may still answer for a moment after the kill began); none since
            before = [s for s in load.acked()]
            promote(standby)
            head_at_promotion = int(query(new, "SELECT coalesce(max(notification_id), 0) FROM {schema}.events")[0][0])
            set_read_only(standby, False)
            promoted = time.monotonic()

            stopped = wait_for(lambda: (b := bucket_rows(new)) and all(went_back(r) for r in b.values()) and b,
                               "every publisher bucket to stop with store_went_back", timeout=180)
            stop_detected = time.monotonic()
            on_new_primary = lambda: [s for s in load.acked() if s.acked_at > promoted]  # noqa: E731
            wait_for(on_new_primary, "a command accepted on the new primary", timeout=180)
            first_accepted = min(s.acked_at for s in on_new_primary())
            load.wait_acked(30, "the load to go on against the new primary")

        # (1) the loss is real: acknowledged commands the new primary lacks
        keys = {k for (k,) in query(new, "SELECT key FROM {schema}.idempotency_keys WHERE tenant = %s", TENANT)}
        lost = [s for s in before if s.key not in keys]
        assert lost, (f"no command acknowledged by the old primary is missing on the new primary ({len(before)} "
                      f"acknowledged, standby head {held} when its receiver was paused): the standby was not held "
                      "behind, and this test shows nothing")

        # (3) the publishers stopped before reusing an id, and say so
        for name, (_, _, error, _) in stopped.items():
            assert error["what_to_do"].startswith("commitline store new-generation"), (name, error)
        shown = fleet.cli("status", "--json")
        assert "store_went_back" in shown.stdout, shown.stdout[-3000:]
        # logged (CRITICAL) by the instance that checked the broker, one line naming every bucket it stopped; a
        # bucket handed over stopped stays so, unlogged
        logged = wait_for(lambda: {name for process in ("publish-1", "publish-2")
                                   for m in fleet.processes[process].output().splitlines()
                                   if " CRITICAL " in m and "stopped: the store went back" in m
                                   for name in m.split(" stopped:")[0].replace(",", " ").split() if name in stopped},
                          "a publish instance to log the stop", timeout=60)
        assert logged == set(stopped), (sorted(logged), sorted(stopped))
        first = read_kafka(kafka_bootstrap, f"{SCHEMA}.")
        one_event_per_id(first, 1)
        beyond = [r for r in first if int(r["notification_id"]) > head_at_promotion]
        assert beyond, "Kafka holds nothing beyond the new head: the publisher was not ahead of the standby"

        # (4) the operator's procedure, as in docs/guides/failover.md
        started = fleet.cli("store", "new-generation", "--reason", "failover to an asynchronous standby")
        assert started.returncode == 0, started.stderr
        others = sorted(n for n in follower_rows(new) if not n.startswith(PUBLISHER))
        wait_for(lambda: all(went_back(r) for n, r in follower_rows(new).items() if n in others),
                 "every follower to stop in the new generation", timeout=120)
        for name in others:  # read models and saga state went back with the store: consistent with its log
            reset = fleet.cli("followers", "reset", name, "--keep", "--reason", "consistent with the promoted store")
            assert reset.returncode == 0, (name, reset.stderr)
        shown = fleet.cli("status", "--json")  # exits 1: unhealthy, as every follower is stopped
        republish_after = min(b["position"] for b in orjson.loads(shown.stdout)["publisher"]["buckets"])  # the guide's N
        assert republish_after == min(p for p, *_ in bucket_rows(new).values()) <= head_at_promotion
        reset = fleet.cli("followers", "reset", PUBLISHER, "--from", str(republish_after), "--reason",
                          "publish in generation 2 what the promoted store holds after every bucket's position")
        assert reset.returncode == 0, reset.stderr
        wait_for(lambda: caught_up(app), "every follower and bucket to go on to the head", timeout=300)

        after = copy.copy(work)
        after.namespace = uuid.uuid4()  # new orders and payments, on the same items
        with Load(fleet.base_url, key, after, threads=3, tag="after") as more:
            more.wait_acked(30, "the load to go on in generation 2")
        retried = load.retry_failed() + more.retry_failed()
        lost_keys = {s.key for s in lost}
        sent = [s for s in [*load.sent.values(), *more.sent.values()] if s.key not in lost_keys]

        wait_for(lambda: caught_up(app), "every follower and bucket to reach the head", timeout=300)
        orders = [uuid.UUID(s.command["order_id"]) for s in sent if s.command["type"] == "place_order"]
        wait_for(lambda: all((f := app.read_models().fulfilment(o, TENANT)) and f.state in SETTLED
                             for o in orders), "every order's fulfilment to settle", timeout=300)
        wait_for(lambda: caught_up(app), "every follower to reach the head after the sagas", timeout=300)

        # (5) unacknowledged commands retried with their key applied once; read models equal a recount
        check_applied_once(new, SCHEMA, TENANT, sent)
        check_each_applied_once(new, SCHEMA, sent)
        check_read_models(app, new, SCHEMA, work)
        assert not app.read_models().fulfilments(stuck_only=True)

        # (2) whole streams, a clean audit, no follower stopped at a poison event
        broken = query(new, "SELECT originator_id FROM {schema}.events GROUP BY 1 "
                            "HAVING min(originator_version) <> 1 OR max(originator_version) <> count(*)")
        assert not broken, f"streams on the new primary that do not start at version 1 or have holes: {broken[:5]}"
        verified = fleet.cli("audit", "verify", "--all")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        for name in ("project", "sagas", "publish-1", "publish-2"):
            assert "stopped at poison event" not in fleet.processes[name].output(), name
        assert not [n for n, r in follower_rows(new).items() if r[1] != "running"]

        # (4) Kafka: every stored event, generation 2 after the reset; the void records told apart by envelope
        records = read_kafka(kafka_bootstrap, f"{SCHEMA}.")
        now = stored(new)
        generation_1 = one_event_per_id(records, 1)
        generation_2 = one_event_per_id(records, 2)
        earlier = {(r["generation"], r["notification_id"], r["event_id"]) for r in first}
        assert generation_2 and all(int(r["generation"]) == 2 for r in records
                                    if (r["generation"], r["notification_id"], r["event_id"]) not in earlier)
        for n, event in now.items():
            assert generation_2.get(n) == event or generation_1.get(n) == event, f"event {event} at {n} not in Kafka"
        events = set(now.values())
        void = {n for n, e in generation_1.items() if e not in events}
        assert void == {n for n in generation_1 if n > head_at_promotion}, "void records not told by their envelope"
        assert all(now[n] == e for n, e in generation_1.items() if n <= head_at_promotion)
        kept = [r for r in records if r["event_id"] in events]
        duplicates = check_kafka({e: (None, 0) for e in events}, kept)  # per-aggregate order, duplicates dropped

        codes = fleet.stop()
    assert codes == dict.fromkeys(codes, 0), codes
    for process in fleet.processes.values():
        assert "Traceback" not in process.output(), process.output()[-5000:]
    with capsys.disabled():
        print(f"\n[async failover] {len(sent) + len(lost)} commands, {len(before)} acknowledged by the old primary, "
              f"{len(lost)} of them lost; {retried} retried with their key; new head at promotion {head_at_promotion} "
              f"(standby at {held} when held); {len(void)} Kafka records of generation 1 beyond it; "
              f"{len([r for r in records if int(r['generation']) == 2])} records in generation 2 ({duplicates} "
              f"duplicates overall); from the kill: promoted after {promoted - killed_at:.1f} s, first command accepted "
              f"on the new primary {first_accepted - killed_at:.1f} s ({first_accepted - promoted:.1f} s after the "
              f"promotion), publisher stop detected {stop_detected - killed_at:.1f} s "
              f"({stop_detected - promoted:.1f} s after the promotion)")


def _answers(pg: EmbeddedPostgres) -> bool:
    try:
        return sql(pg, "SELECT pg_is_in_recovery()") == [(True,)]
    except psycopg.OperationalError:
        return False
