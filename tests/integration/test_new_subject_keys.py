"""A new data subject's key is inserted by the append of the command that first seals under it, in the same
transaction as its events: no transaction of its own before the append, no key left by a command that stores
nothing, and when the subject got a key first (another command of the same batch, another process) the command's
events are sealed again under that key and stored, every value opening."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import psycopg
import pytest

from commitline.application.errors import EventTooLarge
from commitline.composition import Commitline, bootstrap
from commitline.examples.payments import PaymentTransaction
from commitline.infrastructure.personal.keys import DataKeys
from commitline.infrastructure.store.recorder import SubjectKeyTaken
from tests.domains import customers
from tests.support import count_rows, settings_for

pytestmark = pytest.mark.integration
ACCOUNT = "GB33BUKB20201555555555"


@pytest.fixture
def customers_app(pg_dsn: str, schema: str) -> Iterator[Commitline]:
    with bootstrap(settings_for(pg_dsn, schema), domain=customers.domain) as app:
        yield app


def key_rows(pg_dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f'SELECT key_id, tenant, subject FROM "{schema}".data_keys ORDER BY created_at').fetchall()


def sealed_key_ids(pg_dsn: str, schema: str) -> list[str]:
    """The data key id of every sealed value the events hold, in log order."""
    with psycopg.connect(pg_dsn) as conn:
        states = [orjson.loads(bytes(s)) for (s,) in conn.execute(
            f'SELECT state FROM "{schema}".events ORDER BY notification_id')]
    return [s["data"][name]["key_id"] for s in states for name in s.get("pd", ())]


def no_separate_key_writes(app: Commitline) -> list[str]:
    """Make the old way of storing a key (its own transaction) fail; what was attempted is listed."""
    attempted: list[str] = []

    def refuse(*args: Any) -> Any:
        attempted.append("find_or_add")
        raise AssertionError("a data key was written in a transaction of its own")

    app.store.codec.personal.keys.find_or_add = refuse  # type: ignore[attr-defined]
    return attempted


def register(app: Commitline, key: str, customer_id: str, email: str) -> Any:
    return app.dispatch({"type": "register_customer", "customer_id": customer_id, "email": email},
                        idempotency_key=key)


@pytest.mark.parametrize("group_commit", [48, 0], ids=["group-commit", "own-transaction"])
def test_a_new_subjects_key_goes_in_with_the_events_and_never_without_them(pg_dsn: str, schema: str,
                                                                           group_commit: int) -> None:
    with bootstrap(settings_for(pg_dsn, schema, group_commit_max=group_commit)) as app:
        attempted = no_separate_key_writes(app)
        reads: list[str] = []
        find = app.store.codec.personal.keys.find  # type: ignore[attr-defined]
        app.store.codec.personal.keys.find = lambda *a: (reads.append("find"), find(*a))[1]  # type: ignore

        result = app.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": ACCOUNT},
                              idempotency_key="one")
        pid = result.aggregate_id
        assert [(t, s) for _, t, s in key_rows(pg_dsn, schema)] == [("default", str(pid))]
        assert sealed_key_ids(pg_dsn, schema) == [str(key_rows(pg_dsn, schema)[0][0])]
        assert attempted == [] and reads == []  # a payment is its own holder: taken for new without a read

        # the append's transaction fails after its inserts: neither the events nor the key stay
        def fail() -> None:
            raise RuntimeError("the append's transaction fails before COMMIT")

        app.recorder.before_commit = fail
        with pytest.raises(Exception):
            app.dispatch({"type": "create_payment", "amount": "2.00", "currency": "EUR", "account": ACCOUNT},
                         idempotency_key="two")
        app.recorder.before_commit = None
        assert len(key_rows(pg_dsn, schema)) == 1 and count_rows(pg_dsn, schema)["events"] == 1

        # refused before anything is written: no key either
        app.store.max_event_bytes, limit = 300, app.store.max_event_bytes  # type: ignore[attr-defined]
        with pytest.raises(EventTooLarge):
            app.dispatch({"type": "create_payment", "amount": "3.00", "currency": "EUR", "account": "X" * 150},
                         idempotency_key="three")
        app.store.max_event_bytes = limit  # type: ignore[attr-defined]
        assert len(key_rows(pg_dsn, schema)) == 1

        # the retry of the failed command stores its key and its events together, and it opens
        again = app.dispatch({"type": "create_payment", "amount": "2.00", "currency": "EUR", "account": ACCOUNT},
                             idempotency_key="two")
        assert len(key_rows(pg_dsn, schema)) == 2 and count_rows(pg_dsn, schema)["events"] == 2
        assert attempted == []
    with bootstrap(settings_for(pg_dsn, schema)) as fresh:  # nothing cached: read from the table
        assert fresh.load(PaymentTransaction, pid).account == ACCOUNT
        assert fresh.load(PaymentTransaction, again.aggregate_id).account == ACCOUNT
        replayed = fresh.dispatch({"type": "create_payment", "amount": "2.00", "currency": "EUR",
                                   "account": ACCOUNT}, idempotency_key="two")
        assert replayed.replayed and replayed.events[0].payload["account"] == ACCOUNT


def test_a_subject_that_has_a_key_is_sealed_under_it_read_first(customers_app: Commitline, pg_dsn: str,
                                                                schema: str) -> None:
    app = customers_app
    register(app, "a", "c-1", "a@example.com")
    app.store.forget_all()  # nothing held: c-1 is looked up, not guessed (it is no stream's id)
    attempted = no_separate_key_writes(app)
    register(app, "b", "c-1", "b@example.com")
    (row,) = key_rows(pg_dsn, schema)
    assert sealed_key_ids(pg_dsn, schema) == [str(row[0])] * 2 and attempted == []


def hold_until_both(barrier: threading.Barrier, find: Callable[..., Any]) -> Callable[..., Any]:
    """``DataKeys.find`` whose first read returns only once the other writer has read too: both see no key."""
    first = [True]

    def held(*args: Any) -> Any:
        found = find(*args)
        if first.pop() if first else False:
            barrier.wait(timeout=60)
        return found
    return held


@pytest.mark.parametrize("group_commit", [48, 0], ids=["group-commit", "own-transaction"])
def test_two_processes_making_the_same_subject_at_once_both_store_and_every_value_opens(
        pg_dsn: str, schema: str, group_commit: int) -> None:
    barrier = threading.Barrier(2)
    settings = settings_for(pg_dsn, schema, group_commit_max=group_commit)
    with bootstrap(settings, domain=customers.domain) as one, bootstrap(settings, domain=customers.domain) as two:
        taken: list[int] = []
        for app in (one, two):
            keys: DataKeys = app.store.codec.personal.keys  # type: ignore[attr-defined]
            keys.find = hold_until_both(barrier, keys.find)  # type: ignore[method-assign]
            append_batch, append = app.recorder.append_batch, app.recorder.append

            def counted_batch(batch: Any, append_batch: Any = append_batch) -> Any:
                outcomes = append_batch(batch)
                taken.extend(1 for o in outcomes if isinstance(o, SubjectKeyTaken))
                return outcomes

            def counted(*args: Any, append: Any = append, **kwargs: Any) -> Any:
                try:
                    return append(*args, **kwargs)
                except SubjectKeyTaken:
                    taken.append(1)
                    raise
            app.recorder.append_batch, app.recorder.append = counted_batch, counted  # type: ignore[method-assign]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda a: register(a[0], a[1], "c-9", a[2]),
                                    [(one, "one", "one@example.com"), (two, "two", "two@example.com")]))
        assert taken == [1]  # the second to commit was refused once, then sealed under the first one's key
        (row,) = key_rows(pg_dsn, schema)
        assert sealed_key_ids(pg_dsn, schema) == [str(row[0])] * 2
    with bootstrap(settings_for(pg_dsn, schema), domain=customers.domain) as fresh:
        emails = {fresh.load(customers.Customer, r.aggregate_id).email for r in results}
        assert emails == {"one@example.com", "two@example.com"}


def test_one_batch_with_two_commands_making_the_same_subject_stores_both(customers_app: Commitline, pg_dsn: str,
                                                                         schema: str) -> None:
    app = customers_app
    committer = app.store.committer  # type: ignore[attr-defined]
    assert committer is not None
    batches: list[int] = []
    append = app.recorder.append_batch
    app.recorder.append_batch = lambda batch: (batches.append(len(batch)), append(batch))[1]  # type: ignore
    with committer._lock:
        free, committer._free = committer._free, 0  # no batch may start: both commands queue for the same one
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(register, app, key, "c-5", f"{key}@example.com") for key in ("x", "y")]
        wait_for(lambda: len(committer._queue) == 2)
        with committer._lock:
            committer._free = free
            committer._queue[0].call.signal()  # its thread leads the batch of both
        results = [f.result(timeout=60) for f in futures]
    assert batches[0] == 2 and batches[1:] == [1]  # the second was refused in the batch, then stored alone
    (row,) = key_rows(pg_dsn, schema)
    assert sealed_key_ids(pg_dsn, schema) == [str(row[0])] * 2
    app.store.forget_all()
    assert {app.load(customers.Customer, r.aggregate_id).email for r in results} == {"x@example.com", "y@example.com"}


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("the condition was not met in time")


def test_an_idempotent_twin_making_the_same_subject_replays_the_first_outcome(pg_dsn: str, schema: str) -> None:
    barrier = threading.Barrier(2)
    with bootstrap(settings_for(pg_dsn, schema), domain=customers.domain) as one, \
            bootstrap(settings_for(pg_dsn, schema), domain=customers.domain) as two:
        for app in (one, two):
            keys: DataKeys = app.store.codec.personal.keys  # type: ignore[attr-defined]
            keys.find = hold_until_both(barrier, keys.find)  # type: ignore[method-assign]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda a: register(a, "same", "c-7", "twin@example.com"), (one, two)))
    assert sorted(r.replayed for r in results) == [False, True]
    assert {r.aggregate_id for r in results} == {results[0].aggregate_id}
    assert all(r.events[0].payload["email"] == "twin@example.com" for r in results)
    assert len(key_rows(pg_dsn, schema)) == 1 and count_rows(pg_dsn, schema)["events"] == 1
