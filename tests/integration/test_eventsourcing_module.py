"""Regression tests for issue 15: commitline's recorder used from an ``eventsourcing`` Application
(``PERSISTENCE_MODULE=commitline.eventsourcing``), and the recorder fixes that came with it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from eventsourcing.application import Application, ProcessingEvent
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import IntegrityError, Notification, OperationalError, StoredEvent, Tracking
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.system import MultiThreadedRunner, ProcessApplication, System
from psycopg.sql import SQL, Identifier

from commitline.application.chain import GENESIS, chain
from commitline.composition import Commitline
from commitline.eventsourcing import CommitlineApplicationRecorder, IdempotencyKeyUsed
from commitline.infrastructure.store.recorder import EventRecorder
from tests.eventsourcing_suite import library_environment
from tests.support import wait_for


class Counter(Aggregate):
    @event("Created")
    def __init__(self) -> None:
        self.count = 0

    @event("Incremented")
    def increment(self) -> None:
        self.count += 1


class Orders(Application[UUID]):
    name = "Orders"


class Payments(Application[UUID]):
    name = "Payments"


@pytest.fixture
def env(pg_dsn: str, schema: str) -> dict[str, str]:
    return library_environment(pg_dsn, schema)


@pytest.fixture
def orders(env: dict[str, str]) -> Iterator[Orders]:
    app = Orders(env=env)
    yield app
    app.close()


def recorder_of(app: Application[Any]) -> CommitlineApplicationRecorder:
    assert isinstance(app.recorder, CommitlineApplicationRecorder)
    return app.recorder


def stored(topic: str, version: int = 1, originator_id: UUID | None = None) -> StoredEvent:
    return StoredEvent(originator_id=originator_id or uuid4(), originator_version=version, topic=topic, state=b"{}")


def hold_open_write(pg_dsn: str, schema: str, table: str, topic: str) -> psycopg.Connection[Any]:
    """A writer in the recorder's order (xid first, then the id), left open: its id is a gap until it ends."""
    conn = psycopg.connect(pg_dsn)
    conn.execute("SELECT pg_current_xact_id()")
    conn.execute(SQL("INSERT INTO {} (originator_id, originator_version, topic, state, prev_hash, event_hash) "
                     "VALUES (%s, 1, %s, %s, %s, %s)").format(Identifier(schema, table)),
                 (uuid4(), topic, b"{}", GENESIS, GENESIS))
    return conn


# -- writes: no composite type, no table lock, the hash chain ---------------------------------------------


def test_an_application_persists_through_the_module_with_hash_chains(orders: Orders, pg_dsn: str, schema: str) -> None:
    counter = Counter()
    counter.increment()
    recordings = orders.save(counter)
    assert [r.notification.id for r in recordings] == [1, 2]
    assert orders.repository.get(counter.id).count == 1
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(SQL("SELECT originator_version, topic, state, prev_hash, event_hash FROM {} "
                                "ORDER BY originator_version").format(Identifier(schema, "orders_events"))).fetchall()
    events = [StoredEvent(counter.id, v, t, bytes(s)) for v, t, s, _, _ in rows]
    assert [(bytes(p), bytes(h)) for _, _, _, p, h in rows] == chain(GENESIS, events)


def test_commitline_recorders_insert_events_appends_without_a_table_lock(app: Commitline, pg_dsn: str,
                                                                         schema: str) -> None:
    # A stock recorder in the same schema creates the composite type the inherited insert_events used.
    PostgresApplicationRecorder(app.recorder.datastore, events_table_name="stock_events").create_table()
    seen: list[Any] = []

    def look_at_locks() -> None:
        with psycopg.connect(pg_dsn) as other:
            seen.extend(other.execute(
                "SELECT mode FROM pg_locks WHERE relation = %s::regclass AND mode = 'ExclusiveLock'",
                (f"{schema}.events",)).fetchall())

    recorder: EventRecorder = app.recorder
    recorder.before_commit = look_at_locks
    try:
        first = stored("InventoryItemCreated")
        ids = recorder.insert_events([first])
    finally:
        recorder.before_commit = None
    assert ids == [1] and seen == []
    assert recorder.event_hash(first.originator_id, 1) == chain(GENESIS, [first])[0][1]


def test_the_recorder_plugs_into_the_stock_factory_with_one_log_per_application(env: dict[str, str]) -> None:
    stock = {**env, "PERSISTENCE_MODULE": "eventsourcing.postgres",
             "APPLICATION_RECORDER_TOPIC": "commitline.eventsourcing:CommitlineApplicationRecorder"}
    with Orders(env=stock) as orders, Payments(env=stock) as payments:
        assert isinstance(orders.recorder, CommitlineApplicationRecorder)
        orders.save(Counter())
        payments.save(Counter(), Counter())
        assert [n.id for n in orders.recorder.select_notifications(None, 10)] == [1]
        assert [n.id for n in payments.recorder.select_notifications(None, 10)] == [1, 2]


# -- tracking and process recorders -----------------------------------------------------------------------


def test_the_module_has_tracking_and_process_recorders(env: dict[str, str]) -> None:
    with Orders(env=env) as orders:
        tracking = orders.factory.tracking_recorder()
        assert tracking.max_tracking_id("upstream") is None
        tracking.insert_tracking(_tracking("upstream", 3))
        assert tracking.has_tracking_id("upstream", 3) and tracking.max_tracking_id("upstream") == 3
        tracking.wait("upstream", 3)
        process = orders.factory.process_recorder()
        process.insert_events([stored("Sent")], tracking=_tracking("billing", 1))
        with pytest.raises(IntegrityError):  # not above the recorded position: nothing written
            process.insert_events([stored("Sent")], tracking=_tracking("billing", 1))
        assert process.max_tracking_id("billing") == 1 and process.max_notification_id() == 1


def _tracking(name: str, notification_id: int) -> Tracking:
    return Tracking(application_name=name, notification_id=notification_id)


# -- reading the log --------------------------------------------------------------------------------------


def test_a_topic_filter_applies_before_the_limit(orders: Orders) -> None:
    recorder = recorder_of(orders)
    uid = uuid4()
    recorder.insert_events([stored("common", v, uid) for v in range(1, 21)])
    recorder.insert_events([stored("rare")])
    found = recorder.select_notifications(None, 10, topics=["rare"])
    assert [(n.id, n.topic) for n in found] == [(21, "rare")]


def test_commitline_recorder_filters_topics_before_the_limit(app: Commitline) -> None:
    recorder: EventRecorder = app.recorder
    uid = uuid4()
    recorder.insert_events([stored("common", v, uid) for v in range(1, 21)])
    recorder.insert_events([stored("rare")])
    assert [n.id for n in recorder.select_notifications(1, 10, topics=["rare"])] == [21]


def test_a_topic_filter_never_passes_an_open_gap(orders: Orders, pg_dsn: str, schema: str) -> None:
    recorder = recorder_of(orders)
    recorder.insert_events([stored("rare")])  # 1
    late = hold_open_write(pg_dsn, schema, "orders_events", "rare")  # 2, still open
    try:
        recorder.insert_events([stored("common"), stored("rare")])  # 3, 4 commit first
        assert [n.id for n in recorder.select_notifications(None, 10, topics=["rare"])] == [1]
        assert [n.id for n in recorder.select_notifications(None, 10, topics=["rare"])] == [1], "2 is still open"
        late.commit()
    finally:
        late.close()
    assert [n.id for n in recorder.select_notifications(None, 10, topics=["rare"])] == [1, 2, 4]


def test_start_zero_reads_from_the_first_notification(orders: Orders) -> None:
    recorder = recorder_of(orders)
    recorder.insert_events([stored("a"), stored("b")])
    assert [n.id for n in recorder.select_notifications(start=0, limit=10)] == [1, 2]
    assert [n.id for n in recorder.select_notifications(start=0, limit=10, topics=["b"])] == [2]


def test_a_subscription_passes_an_aborted_write_without_another_write(orders: Orders, pg_dsn: str,
                                                                      schema: str) -> None:
    recorder = recorder_of(orders)
    received: list[Notification] = []
    with recorder.subscribe(gt=0) as subscription:

        def consume() -> None:
            for notification in subscription:
                received.append(notification)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        aborted = hold_open_write(pg_dsn, schema, "orders_events", "lost")  # id 1
        aborted.rollback()
        aborted.close()
        recorder.insert_events([stored("kept")])  # id 2: its NOTIFY finds a gap not yet proven
        wait_for(lambda: [n.id for n in received] == [2], "the committed event after the aborted one", timeout=30)
    consumer.join(30)


class Tally(ProcessApplication[UUID]):
    """Counts the Counters its leader created (the policy records nothing, only counts)."""

    name = "Tally"

    def __init__(self, env: Any = None) -> None:
        super().__init__(env)
        self.seen = 0

    def policy(self, domain_event: Any, processing_event: ProcessingEvent) -> None:
        if type(domain_event).__name__ == "Created":
            self.seen += 1


def test_a_multithreaded_runner_passes_a_rolled_back_write(env: dict[str, str], pg_dsn: str, schema: str) -> None:
    """The runner reads only when a commit prompts it; a read cut short by a write that then rolls back
    (which prompts nobody) waits for it to end instead of leaving the follower stalled."""
    runner: MultiThreadedRunner[UUID] = MultiThreadedRunner(System([[Orders, Tally]]), env=env)
    runner.start()
    try:
        orders, tally = runner.get(Orders), runner.get(Tally)
        for round_ in range(1, 13):
            aborted = hold_open_write(pg_dsn, schema, "orders_events", "lost")
            orders.save(Counter())  # its id is above the open write's: the prompted read stops at the gap
            aborted.rollback()
            aborted.close()
            wait_for(lambda: tally.seen == round_, f"the event after rolled-back write {round_}", timeout=30)
    finally:
        runner.stop()


# -- errors -----------------------------------------------------------------------------------------------


def test_errors_are_eventsourcings_own(orders: Orders, env: dict[str, str]) -> None:
    counter = Counter()
    orders.save(counter)
    stale = orders.repository.get(counter.id)
    counter.increment()
    orders.save(counter)
    stale.increment()
    with pytest.raises(IntegrityError):
        orders.save(stale)
    with pytest.raises(OperationalError):
        Orders(env={**env, "POSTGRES_PORT": "1", "POSTGRES_CONNECT_TIMEOUT": "1"})


def test_an_idempotency_key_is_recorded_with_the_events(orders: Orders) -> None:
    orders.save(Counter(), idempotency_key="k-1")
    with pytest.raises(IdempotencyKeyUsed) as refused:
        orders.save(Counter(), idempotency_key="k-1")
    assert isinstance(refused.value, IntegrityError) and "k-1" in str(refused.value)
    assert recorder_of(orders).idempotency_key_recorded("k-1")
    assert recorder_of(orders).max_notification_id() == 1


def test_an_application_whose_tables_the_stock_module_made_is_refused_at_construction(env: dict[str, str],
                                                                                       pg_dsn: str,
                                                                                       schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the stock module makes tables, not schemas
        conn.execute(SQL("CREATE SCHEMA IF NOT EXISTS {}").format(Identifier(schema)))
    stock = Orders(env={**env, "PERSISTENCE_MODULE": "eventsourcing.postgres"})
    counter = Counter()
    stock.save(counter)
    stock.close()
    for create_table in ("y", "n"):  # with CREATE_TABLE off too, whose construction creates nothing to check by
        with pytest.raises(Exception, match=r"orders_events was made by eventsourcing's own persistence module: "
                                            r"commitline\.eventsourcing does not convert it in place") as refused:
            Orders(env={**env, "CREATE_TABLE": create_table})
        assert type(refused.value).__name__ == "ProgrammingError"
    with psycopg.connect(pg_dsn) as conn:
        made = conn.execute("SELECT to_regclass(%s)", (f"{schema}.orders_events_idempotency",)).fetchone()
    assert made == (None,)  # nothing was created beside the stock table


def test_calls_on_connections_the_server_dropped_are_made_again_as_the_stock_module_makes_them(
        pg_dsn: str, schema: str) -> None:
    """A server restart, a failover or an idle timeout drops every pooled connection: each call that meets one is
    made again on another (eventsourcing's own recorders retry the same errors, ten times, 0.2 s apart), so no
    save or read fails for it and none is lost."""
    from contextlib import ExitStack

    app = Orders(env={**library_environment(pg_dsn, schema), "POSTGRES_POOL_SIZE": "3",
                      "POSTGRES_MAX_OVERFLOW": "0"})
    try:
        counter = Counter()
        app.save(counter)
        datastore = recorder_of(app).datastore
        with ExitStack() as held:  # every pooled connection at once, to learn their server processes
            pids = [held.enter_context(datastore.get_connection()).info.backend_pid for _ in range(3)]
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            assert admin.execute("SELECT count(*) FROM unnest(%s::int[]) AS p WHERE pg_terminate_backend(p)",
                                 (pids,)).fetchone() == (3,)
        for _ in range(5):
            loaded = app.repository.get(counter.id)
            loaded.increment()
            app.save(loaded)
        assert app.repository.get(counter.id).count == 5
        assert app.recorder.max_notification_id() == 6
        assert len(app.recorder.select_notifications(1, 10)) == 6
    finally:
        app.close()
