"""Projection rebuild: events/s of ``rebuild`` per projection, against reading the log and the stock runner.

``projection_rebuild`` (one run, one database, one schema)

    Pre-fill: a log of 200,000 events (``--quick``: 40,000) written straight through
    ``recorder.append`` in transactions of 2,000 stored events, built with
    ``codec.encode_event`` from real domain events made by the aggregates' own command
    methods (so every event is valid: no projection ever meets a poison event). One event
    of each kind in turn, so the log is a third of each:

    - survey: ``SurveyTask.create`` + ``issue`` to 50 users, then 45 of them answer
      (``SurveyTaskAnswered`` on their own ``SurveyAssignment`` stream, version 1);
    - payments, in waves of 500: created, submitted, then completed (3 of 4) or failed
      (1 of 4), the failed ones submitted again and completed (state changes of a payment
      land in later batches than its creation, so ``prefetch`` reads stored rows);
    - inventory, in waves of 200 items: 100 received, then 3 rounds of reserve 5,
      release or fulfil it, receive 10.

    The log's length and head are checked (ids 1..N, no gap), then the events table is
    VACUUMed and ANALYZEd, as autovacuum would soon do: without statistics the planner reads each
    page of the log with a bitmap scan + sort of everything after the position (~70 ms per page of
    5,000 instead of ~1.5 ms), which halves every figure below; and an autovacuum of the new rows
    running during the first round would slow whatever it meets.

    Baselines, same log, same batch size as ``rebuild`` (5,000):

    - ``read_raw``: ``recorder.select_notifications(position + 1, 5000)`` from 1 to the head,
      nothing else;
    - ``read_only``: the same reads plus ``codec.decode_event`` of every event: the read +
      decode path of the rebuild, without handlers or writes.

    Both run under the collector settings a rebuild uses while it runs
    (``commitline.infrastructure.collection.bulk_collection``), so the ratios compare the work done,
    not two memory regimes (with the interpreter's defaults the decoded pass is ~20% slower).

    Measured: ``Commitline.rebuild(name)`` (default batch size 5,000) of each
    projection in ``PROJECTIONS``, one after another, each timed around the whole call
    (lease, fresh ``__next`` tables, every batch, swap); then ``Commitline.rebuild_many`` of all
    of them in one process (``projections rebuild --all --jobs 1``: the log read once, each batch
    applied to every read model), and ``rebuild_many(..., jobs=JOBS)``, what ``projections rebuild
    --all`` runs by default on this machine: the projections split into ``JOBS`` groups (the cores
    the bench may use, at most one per projection), one rebuilt in the bench's process, each other
    by a worker process started for it (its start-up, about 0.6 s, inside the time), each timed the
    same way.

    Rounds: three (``--quick`` too, on a smaller log), each: raw, decoded, every rebuild, then
    all of them in one process, then in ``JOBS``; the first raw pass also warms the cache for
    everything after it.
    Every figure is the median of the three rounds, and each ratio is the median of its
    per-round ratios (a rebuild against the read-only pass of its own round), so each rebuild
    is compared with as many read-only passes as it had runs. events/s = log length / seconds
    (a rebuild scans the whole log; it receives, decodes and applies only the events it handles).
    Targets: per rebuild >= 30,000 events/s and >= 0.8 of ``read_only``; all rebuilt by
    ``projections rebuild --all`` (``JOBS`` processes) <= 1.5 x the slowest single rebuild of the
    same round (the one-process figure is printed beside it). Also printed: each rebuild's
    applied events/s (events its handlers ran on). Afterwards the live read models are
    checked against totals tallied while writing the log.

    Stock baseline, same run: ``eventsourcing.projection.ProjectionRunner`` (9.5) with a
    ``Projection`` counting users per (task, status) into a PostgreSQL table of a
    ``PostgresTrackingRecorder`` subclass (the view), one transaction per event holding the
    counter upsert and the tracking record, as in the library's projection docs. Its log
    (10,000 events, ``--quick``: 5,000, only survey events, so every one is applied) is
    written beforehand by a stock ``Application`` with PostgreSQL persistence in the same
    schema (``PERSISTENCE_MODULE=eventsourcing.postgres``, ``POSTGRES_SCHEMA``): per task a
    ``StockTask`` created + issued to 50 users and 45 ``StockAssignment``s answered, saved
    together. Timed from constructing the runner (app, view, subscription) to the commit of
    the view's last transaction. Printed with our ratios: ``task_statuses``' log events/s
    over its events/s, and ``task_statuses``' applied events/s over its events/s (the like
    for like figure: both count events a handler wrote).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.application import Application
from eventsourcing.dispatch import singledispatchmethod
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import Tracking
from eventsourcing.postgres import PostgresDatastore, PostgresTrackingRecorder
from eventsourcing.projection import Projection as StockProjection
from eventsourcing.projection import ProjectionRunner
from eventsourcing.utils import get_topic
from psycopg.sql import SQL, Identifier

from bench.harness import POOL_MAX_OVERFLOW, POOL_SIZE, BenchContext, commitline_app, fresh_schema
from bench.example_log import ANSWERS_PER_TASK, USERS_PER_TASK, inventory_events, payment_events, survey_events
from commitline.composition.rebuild_workers import available_cores
from commitline.domain import Event
from commitline.examples import domain
from commitline.examples.inventory import ReservationFulfilled, ReservationReleased, StockReceived, StockReserved
from commitline.examples.payments import PaymentCreated, PaymentState
from commitline.examples.surveys import SurveyTaskAnswered, SurveyTaskIssued
from commitline.infrastructure.store.codec import EventCodec, encode_event
from commitline.infrastructure.store.recorder import EventRecorder

try:
    from commitline.infrastructure.collection import bulk_collection
except ImportError:  # a commitline before it (to measure it with this bench): the same settings
    import contextlib
    import gc

    @contextlib.contextmanager  # type: ignore[no-redef]
    def bulk_collection() -> Iterator[None]:
        before = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(50_000, 20, 10)
        try:
            yield
        finally:
            gc.set_threshold(*before)

PROJECTIONS = domain.check().projections  # the examples' read models
CODEC = EventCodec(domain.registry)

TENANT = "default"
CHUNK = 2_000  # stored events per append transaction while pre-filling
BATCH = 5_000  # rebuild's default batch size; the read-only passes use the same
TARGET_RATE, TARGET_RATIO = 30_000, 0.8
TARGET_ALL = 1.5  # all read models rebuilt by `projections rebuild --all` / the slowest single rebuild
#: The processes `projections rebuild --all` rebuilds in by default: the cores it may use (at most one per projection).
JOBS = min(available_cores(), len(PROJECTIONS))
ROUNDS = 3

# --------------------------------------------------------------------------- the log


class Tally:
    """What the read models must say once the log is projected, counted while writing it."""

    def __init__(self) -> None:
        self.pending = self.done = 0
        self.payment_state: dict[UUID, str] = {}
        self.on_hand = self.reserved = 0
        self.types: Counter[str] = Counter()

    def add(self, e: Event) -> None:
        self.types[type(e).__name__] += 1
        match e:
            case SurveyTaskIssued(user_ids=users):
                self.pending += len(users)
            case SurveyTaskAnswered():
                self.pending, self.done = self.pending - 1, self.done + 1
            case PaymentCreated():
                self.payment_state[e.aggregate_id] = PaymentState.CREATED.value
            case _ if type(e).__name__.startswith("Payment"):
                self.payment_state[e.aggregate_id] = {"PaymentSubmitted": "PENDING", "PaymentCompleted": "COMPLETED",
                                                      "PaymentFailed": "FAILED"}[type(e).__name__]
            case StockReceived(quantity=q):
                self.on_hand += q
            case StockReserved(quantity=q):
                self.reserved += q
            case ReservationReleased(quantity=q):
                self.reserved -= q
            case ReservationFulfilled(quantity=q):
                self.reserved, self.on_hand = self.reserved - q, self.on_hand - q

    def expected(self) -> dict[str, Any]:
        states = Counter(self.payment_state.values())
        return {"pending": self.pending, "done": self.done, "payments": dict(sorted(states.items())),
                "on_hand": self.on_hand, "reserved": self.reserved}


def prefill(recorder: EventRecorder, total: int) -> Tally:
    mixed = itertools.chain.from_iterable(zip(survey_events(), payment_events(), inventory_events()))
    tally = Tally()
    events = itertools.islice(mixed, total)
    while chunk := list(itertools.islice(events, CHUNK)):
        for e in chunk:
            tally.add(e)
        recorder.append([encode_event(e, TENANT) for e in chunk])
    return tally


def read_models(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    def one(query: str) -> Any:
        return conn.execute(SQL(query).format(schema=Identifier(schema))).fetchall()

    statuses = dict(one("SELECT status, sum(users)::bigint FROM {schema}.rm_task_statuses GROUP BY status"))
    payments = dict(one("SELECT state, sum(payments)::bigint FROM {schema}.rm_payment_totals GROUP BY state"))
    (on_hand, reserved), = one("SELECT sum(on_hand)::bigint, sum(reserved)::bigint FROM {schema}.rm_inventory_levels")
    return {"pending": statuses.get("PENDING", 0), "done": statuses.get("DONE", 0),
            "payments": {k: v for k, v in sorted(payments.items()) if v}, "on_hand": on_hand, "reserved": reserved}


# --------------------------------------------------------------------------- read-only passes


def read_pass(recorder: EventRecorder, head: int, decode: bool) -> tuple[int, float]:
    position, seen = 0, 0
    t0 = time.perf_counter()
    while position < head:
        batch = recorder.select_notifications(position + 1, BATCH)
        if not batch:
            raise RuntimeError(f"empty read at position {position} below the head {head}")
        if decode:
            for n in batch:
                CODEC.decode_event(n.topic, n.originator_id, n.originator_version, n.state)
        seen += len(batch)
        position = batch[-1].id
    return seen, time.perf_counter() - t0


# --------------------------------------------------------------------------- stock baseline


class StockTask(Aggregate):
    @event("Created")
    def __init__(self, title: str) -> None:
        self.title = title
        self.issued: list[str] = []

    @event("Issued")
    def issue(self, user_ids: list[str]) -> None:
        self.issued = self.issued + list(user_ids)


class StockAssignment(Aggregate):
    @event("Answered")
    def __init__(self, task_id: UUID, user_id: str) -> None:
        self.task_id, self.user_id = task_id, user_id


class StockSurveys(Application[UUID]):
    name = "BenchSurveys"  # its table: <schema>.benchsurveys_events


class StockTaskStatusesView(PostgresTrackingRecorder):
    """Users per (task, status), each change committed with its tracking record."""

    def __init__(self, datastore: PostgresDatastore, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        self.counts = Identifier(self.datastore.schema, "stock_task_statuses")
        self.sql_create_statements.append(SQL(
            "CREATE TABLE IF NOT EXISTS {} (task_id uuid, status text, users bigint NOT NULL DEFAULT 0, "
            "PRIMARY KEY (task_id, status))").format(self.counts))
        self.upsert = SQL("INSERT INTO {} AS t (task_id, status, users) VALUES (%s, %s, %s) "
                          "ON CONFLICT (task_id, status) DO UPDATE SET users = t.users + excluded.users"
                          ).format(self.counts)
        self.last_commit = 0.0

    def add(self, changes: list[tuple[UUID, str, int]], tracking: Tracking) -> None:
        with self.datastore.transaction(commit=True) as curs:
            for task_id, status, delta in changes:
                curs.execute(self.upsert, (task_id, status, delta), prepare=True)
            self._insert_tracking(curs, tracking)
        self.last_commit = time.perf_counter()

    def totals(self) -> dict[str, int]:
        with self.datastore.transaction() as curs:
            curs.execute(SQL("SELECT status, sum(users)::bigint AS n FROM {} GROUP BY status").format(self.counts))
            return {row["status"]: row["n"] for row in curs.fetchall()}


class StockTaskStatuses(StockProjection[StockTaskStatusesView]):
    name = "benchtaskstatuses"
    topics = (get_topic(StockTask.Created), get_topic(StockTask.Issued), get_topic(StockAssignment.Answered))

    @singledispatchmethod
    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        self.view.insert_tracking(tracking)

    @process_event.register
    def created(self, domain_event: StockTask.Created, tracking: Tracking) -> None:
        self.view.add([(domain_event.originator_id, "PENDING", 0), (domain_event.originator_id, "DONE", 0)], tracking)

    @process_event.register
    def issued(self, domain_event: StockTask.Issued, tracking: Tracking) -> None:
        self.view.add([(domain_event.originator_id, "PENDING", len(domain_event.user_ids))], tracking)

    @process_event.register
    def answered(self, domain_event: StockAssignment.Answered, tracking: Tracking) -> None:
        self.view.add([(domain_event.task_id, "PENDING", -1), (domain_event.task_id, "DONE", 1)], tracking)


def stock_environment(ctx: BenchContext, schema: str) -> dict[str, str]:
    parts = ctx.parts()
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": parts["dbname"], "POSTGRES_HOST": parts["host"], "POSTGRES_PORT": str(parts["port"]),
        "POSTGRES_USER": parts["user"], "POSTGRES_PASSWORD": parts["password"], "POSTGRES_SCHEMA": schema,
        "POSTGRES_POOL_SIZE": str(POOL_SIZE), "POSTGRES_MAX_OVERFLOW": str(POOL_MAX_OVERFLOW), "CREATE_TABLE": "y",
    }


def stock_runner(ctx: BenchContext, schema: str, total: int) -> tuple[int, float, dict[str, int]]:
    """Write ``total`` survey events with the stock app, project them with ProjectionRunner: (events, s, totals)."""
    env = stock_environment(ctx, schema)
    writer = StockSurveys(env=env)
    users = [f"user-{i}" for i in range(USERS_PER_TASK)]
    written, last_id = 0, 0
    try:
        while written < total:
            task = StockTask("bench survey")
            task.issue(users)
            answers = [StockAssignment(task.id, u) for u in users[:ANSWERS_PER_TASK]][: max(0, total - written - 2)]
            recordings = writer.save(task, *answers)
            written += len(recordings)
            last_id = recordings[-1].notification.id
    finally:
        writer.close()

    t0 = time.perf_counter()
    runner = ProjectionRunner(application_class=StockSurveys, projection_class=StockTaskStatuses,
                              view_class=StockTaskStatusesView, env=env)
    try:
        with runner:
            runner.wait(last_id, timeout=600)
            seconds = runner.view.last_commit - t0
            totals = runner.view.totals()
    finally:
        runner.view.datastore.close()
    return written, seconds, totals


# --------------------------------------------------------------------------- the benchmark


def verdict(rate: float, ratio: float) -> str:
    ok = rate >= TARGET_RATE and ratio >= TARGET_RATIO
    return (f"goal reads this rebuild's events/s and its ratio to read_only, medians of {ROUNDS} rounds: "
            f">= {TARGET_RATE} events/s and >= {TARGET_RATIO}: {'met' if ok else 'MISSED'}")


def median(values: list[float]) -> float:
    return statistics.median(values)


def projection_rebuild(ctx: BenchContext) -> Iterator[str]:
    total, stock_total = (40_000, 5_000) if ctx.quick else (200_000, 10_000)
    rounds = ROUNDS
    with fresh_schema(ctx.dsn) as schema:
        with commitline_app(ctx.dsn, schema) as app:
            t0 = time.perf_counter()
            tally = prefill(app.recorder, total)
            fill_seconds = time.perf_counter() - t0
            head = app.recorder.max_notification_id() or 0
            with psycopg.connect(ctx.dsn, autocommit=True) as conn:
                conn.execute(SQL("VACUUM (ANALYZE) {}").format(Identifier(schema, "events")))
                count = conn.execute(SQL("SELECT count(*) FROM {}").format(Identifier(schema, "events"))).fetchone()[0]
            if count != total or head != total:
                raise RuntimeError(f"pre-filled log has {count} events, head {head}; expected {total}")
            kinds = ", ".join(f"{k}={v}" for k, v in sorted(tally.types.items()))
            yield (f"projection rebuild log: {count} events (ids 1..{head}) written in {fill_seconds:.1f} s "
                   f"({count / fill_seconds:.0f} events/s, {CHUNK} per transaction): {kinds}")

            # per round: raw, decoded, every rebuild, then all in one pass (the first raw pass also warms the
            # cache for everything after it); seconds per round, medians over the rounds
            raw_s: list[float] = []
            dec_s: list[float] = []
            runs: dict[str, list[float]] = {name: [] for name in PROJECTIONS}
            applied: dict[str, int] = {}
            all_s: list[float] = []
            jobs_s: list[float] = []
            for _ in range(rounds):
                for seconds, decode in ((raw_s, False), (dec_s, True)):
                    with bulk_collection():
                        seen, took = read_pass(app.recorder, head, decode)
                    if seen != head:
                        raise RuntimeError(f"read pass saw {seen} events, head is {head}")
                    seconds.append(took)
                for name in PROJECTIONS:
                    t0 = time.perf_counter()
                    result = app.rebuild(name)
                    runs[name].append(time.perf_counter() - t0)
                    applied[name] = result.events_applied
                    if result.position != head:
                        raise RuntimeError(f"rebuild of {name} stopped at {result.position}, head is {head}")
                for seconds, jobs in ((all_s, 1), (jobs_s, JOBS)):
                    t0 = time.perf_counter()
                    results = app.rebuild_many(list(PROJECTIONS), jobs=jobs)
                    seconds.append(time.perf_counter() - t0)
                    for result in results:
                        if result.position != head or result.events_applied != applied[result.projection]:
                            raise RuntimeError(f"rebuild of all ({jobs} processes): {result.projection} stopped at "
                                               f"{result.position} with {result.events_applied} applied; alone: "
                                               f"{applied[result.projection]}")
            read_only = head / median(dec_s)
            yield (f"projection rebuild read_raw: {head / median(raw_s):.0f} events/s ({head} events, "
                   f"{median(raw_s):.2f} s; select_notifications of {BATCH}, no decode; median of {rounds})")
            yield (f"projection rebuild read_only: {read_only:.0f} events/s ({head} events, {median(dec_s):.2f} s; "
                   f"select_notifications of {BATCH} + decode_event of every event; median of {rounds}; as a rebuild "
                   "collects garbage)")

            times: dict[str, float] = {}
            for name in PROJECTIONS:
                times[name] = median(runs[name])
                rate = head / times[name]
                ratio = median([d / r for d, r in zip(dec_s, runs[name])])
                yield (f"projection rebuild {name}: {rate:.0f} events/s ({head} events, {times[name]:.2f} s, median "
                       f"of {rounds}) read_only={read_only:.0f} events/s ratio={ratio:.2f} "
                       f"(per round {', '.join(f'{d / r:.2f}' for d, r in zip(dec_s, runs[name]))}) "
                       f"applied={applied[name]} ({applied[name] / times[name]:.0f} applied events/s) "
                       f"[{verdict(rate, ratio)}]")
            n = len(times)
            slowest = [max(runs[name][i] for name in PROJECTIONS) for i in range(rounds)]
            all_ratio = median([a / s for a, s in zip(all_s, slowest)])
            all_ratio_ro = median([d / a for d, a in zip(dec_s, all_s)])
            yield (f"projection rebuild all {n} in one pass, one process (rebuild_many, `projections rebuild --all "
                   f"--jobs 1`): {head / median(all_s):.0f} events/s ({median(all_s):.2f} s, median of {rounds}) "
                   f"slowest_single={median(slowest):.2f} s ratio_all_to_slowest={all_ratio:.2f} "
                   f"(per round {', '.join(f'{a / s:.2f}' for a, s in zip(all_s, slowest))}; one after another: "
                   f"{sum(times.values()):.2f} s) ratio_to_read_only={all_ratio_ro:.2f}")
            jobs_ratio = median([a / s for a, s in zip(jobs_s, slowest)])
            yield (f"projection rebuild all {n} in {JOBS} processes (rebuild_many(jobs={JOBS}), `projections rebuild "
                   f"--all` on {JOBS} cores, worker start-up included): {head / median(jobs_s):.0f} events/s "
                   f"({median(jobs_s):.2f} s, median of {rounds}) slowest_single={median(slowest):.2f} s "
                   f"ratio_all_to_slowest={jobs_ratio:.2f} (per round "
                   f"{', '.join(f'{a / s:.2f}' for a, s in zip(jobs_s, slowest))}; one process: {median(all_s):.2f} s) "
                   f"[goal reads ratio_all_to_slowest: all {n} rebuilt by `projections rebuild --all` / the slowest "
                   f"single rebuild of the same round, median of {rounds}: <= {TARGET_ALL}: "
                   f"{'met' if jobs_ratio <= TARGET_ALL else 'MISSED'}]")

            with psycopg.connect(ctx.dsn) as conn:
                found = read_models(conn, schema)
            expected = tally.expected()
            yield (f"projection rebuild check: read models {'match' if found == expected else 'DIFFER FROM'} the log"
                   + ("" if found == expected else f": expected {expected}, found {found}"))

        stock_n, stock_s, stock_totals = stock_runner(ctx, schema, stock_total)
        stock_rate = stock_n / stock_s
        ours_applied = applied["task_statuses"] / times["task_statuses"]
        yield (f"projection rebuild stock ProjectionRunner: {stock_rate:.0f} events/s ({stock_n} events, "
               f"{stock_s:.1f} s, one transaction per event; users by status {dict(sorted(stock_totals.items()))}) "
               f"ratio task_statuses/stock={head / times['task_statuses'] / stock_rate:.1f} "
               f"task_statuses_applied/stock={ours_applied / stock_rate:.1f}")


#: What ``python -m bench`` runs from this module, in order: (name, callable).
BENCHMARKS = (("projection_rebuild", projection_rebuild),)
