"""The exactly-once rules of ``commitline.application.dispatching``, each stated and asserted on a real store.

Races are staged, never timed: a command's read of the store is wrapped so that another writer (a second
commitline on the same schema, with its own pool and cache: another process) commits exactly between this
command's read and its append.

Rules already asserted elsewhere (the numbers are the module docstring's):

1. Key lookup: ``test_idempotency.py::test_sequential_retry_returns_the_stored_outcome`` (a used key answers
   before the command, which would now be refused, is decided again), ``test_idempotency.py::
   test_twenty_concurrent_dispatches_with_one_key_execute_once``, ``test_throughput_mechanisms.py::
   test_a_key_used_by_another_process_answers_even_when_the_copy_is_cached``.
2. Load: ``test_throughput_mechanisms.py::test_a_cached_stream_is_decided_on_without_a_read_and_a_stale_copy_is_
   never_stored``, ``test_throughput_mechanisms.py::test_expected_version_on_a_stale_cached_copy_follows_the_
   stored_stream``, ``test_throughput_mechanisms.py::test_the_cache_applies_what_another_process_wrote``.
3. Decide: ``test_refusals_write_nothing.py`` (a refusal writes nothing).
4. Append: ``test_throughput_mechanisms.py::test_a_decision_on_a_state_gone_stale_after_the_read_is_retried_not_
   stored``, ``test_concurrency.py::test_fifty_concurrent_transitions_have_exactly_one_winner``.
5. Conflict re-run: ``test_concurrency.py::test_reservations_without_expected_version_retry_until_stock_runs_out``,
   ``test_throughput_mechanisms.py::test_a_decision_on_a_state_gone_stale_after_the_read_is_retried_not_stored``
   (with ``expected_version``: ``ConcurrencyConflict`` with the stored version).
6. Twin wait: ``test_throughput_mechanisms.py::test_with_expected_version_a_lost_race_to_its_own_twin_answers_
   with_the_twins_outcome``, ``test_idempotency.py::test_concurrent_twins_with_different_payloads``.
7. Replay: ``test_idempotency.py::test_same_key_different_payload_is_refused_and_writes_nothing``,
   ``test_idempotency.py::test_keys_are_scoped_by_tenant``.
8. Tenants: ``test_tenant_isolation.py`` (every command type on another tenant's stream, ``id_unavailable``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from uuid import UUID, uuid4

import pytest

from commitline.application.errors import (
    AggregateNotFound,
    ConcurrencyConflict,
    IdempotencyKeyReused,
    StoreUnavailable,
)
from commitline.application.processor import DispatchObserver
from commitline.application.retry import RetryPolicy
from commitline.composition import Commitline, bootstrap
from commitline.examples.inventory import InventoryItem
from tests.support import count_rows, settings_for


class Recorded(DispatchObserver):
    """Every retry and outcome a dispatch reports."""

    def __init__(self) -> None:
        self.retries: list[str] = []
        self.outcomes: list[tuple[str, str, str | None]] = []

    def on_retry(self, command_type: str) -> None:
        self.retries.append(command_type)

    def on_outcome(self, command_type: str, outcome: str, code: str | None, seconds: float) -> None:
        self.outcomes.append((command_type, outcome, code))


@pytest.fixture
def elsewhere(pg_dsn: str, schema: str, app: Commitline) -> Iterator[Commitline]:
    """Another writer on the same schema, with its own pool and cache, as another process would be."""
    with bootstrap(settings_for(pg_dsn, schema)) as other:
        yield other


@pytest.fixture
def observed(app: Commitline) -> Recorded:
    app.processor.observer = recorded = Recorded()
    return recorded


def receive(item: UUID, quantity: int = 1, **extra: object) -> dict[str, object]:
    return {"type": "receive_stock", "item_id": str(item), "quantity": quantity, **extra}


def new_item(app: Commitline, quantity: int = 1) -> UUID:
    return app.dispatch(receive(uuid4(), quantity), idempotency_key=f"new-{uuid4()}").aggregate_id


def after_each_read(app: Commitline, meanwhile: Callable[[], None], *, hide_key: bool = False) -> list[UUID]:
    """From now on, every command read of ``app``'s store is followed by ``meanwhile()`` (another writer
    committing between this command's read and its append); the ids read are returned. With ``hide_key``
    ``meanwhile()`` commits first and the key's record is read as if looked up before it: the lookup and the
    aggregate's read are two statements, each seeing what was committed when it ran."""
    read = app.recorder.read_for_command
    reads: list[UUID] = []

    def staged(aggregate_id: UUID, known: int, snapshot: bool, tenant: str, key: str) -> object:
        reads.append(aggregate_id)
        if hide_key:
            meanwhile()
            return read(aggregate_id, known, snapshot, tenant, f"not-yet-{key}")
        found = read(aggregate_id, known, snapshot, tenant, key)
        meanwhile()
        return found

    app.recorder.read_for_command = staged  # type: ignore[method-assign]
    return reads


def stock(app: Commitline, item: UUID) -> int:
    return app.store.load(InventoryItem, item, use_snapshot=False).on_hand


# -- 2. Load: a cached copy is decided on without a read, and its verdict is not final -----------------------


def test_a_refusal_on_a_stale_cached_copy_is_decided_again_on_a_read_without_a_retry(
        app: Commitline, elsewhere: Commitline, observed: Recorded) -> None:
    item = new_item(app)  # cached here: on hand 1
    elsewhere.dispatch(receive(item, 10), idempotency_key="more")  # stored: on hand 11; the copy here says 1
    reads = after_each_read(app, lambda: None)

    result = app.dispatch({"type": "reserve_stock", "item_id": str(item), "reservation_id": "r", "quantity": 5},
                          idempotency_key="reserve")

    # Refused on the copy (1 < 5), which was no answer: read, decided again, accepted.
    assert not result.replayed and result.version == 3
    assert reads == [item]
    assert observed.retries == [] and observed.outcomes[-1] == ("reserve_stock", "applied", None)


def test_a_stream_moved_under_a_cached_copy_is_read_from_then_on_and_the_rerun_is_a_retry(
        app: Commitline, elsewhere: Commitline, observed: Recorded) -> None:
    item = new_item(app)
    elsewhere.dispatch(receive(item, 10), idempotency_key="more")
    reads = after_each_read(app, lambda: None)

    result = app.dispatch(receive(item, 100), idempotency_key="after")  # accepted on the copy, lost the version

    assert result.version == 3 and stock(app, item) == 111
    assert reads == [item] and observed.retries == ["receive_stock"]
    app.dispatch(receive(item), idempotency_key="later")
    assert reads == [item, item], "a stream another writer moved is read before every later command"


# -- 3 and 6. Decide, and a twin's outcome before a refusal ----------------------------------------------------


def test_a_refusal_of_a_state_a_twin_made_after_the_key_lookup_answers_with_the_twins_outcome(
        app: Commitline, elsewhere: Commitline, observed: Recorded) -> None:
    payment = app.dispatch({"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "a"},
                           idempotency_key="create").aggregate_id
    submit = {"type": "submit_payment", "payment_id": str(payment)}
    twin: list[object] = []
    app.store.cache.take(payment)  # a read-verified run
    after_each_read(app, lambda: twin.append(elsewhere.dispatch(submit, idempotency_key="submit")), hide_key=True)

    # The key was not found, then the twin committed, then the payment was read: already submitted, refused.
    result = app.dispatch(submit, idempotency_key="submit")

    assert result.replayed and result.model_copy(update={"replayed": False}) == twin[0]
    assert observed.outcomes[-1] == ("submit_payment", "replayed", None)


# -- 4, 6 and 7. Append; a twin that committed first answers, for the same request only ------------------------


def test_a_twin_committing_between_lookup_and_append_answers_with_its_outcome(
        app: Commitline, elsewhere: Commitline, pg_dsn: str, schema: str, observed: Recorded) -> None:
    item = new_item(app)
    twin: list[object] = []
    app.store.cache.take(item)
    reads = after_each_read(app, lambda: twin.append(elsewhere.dispatch(receive(item, 5), idempotency_key="twin")))
    before = count_rows(pg_dsn, schema)

    result = app.dispatch(receive(item, 5), idempotency_key="twin")

    assert result.replayed and result.model_copy(update={"replayed": False}) == twin[0]
    assert reads == [item] and observed.retries == [], "the key's record answered: no re-run"
    assert count_rows(pg_dsn, schema)["events"] == before["events"] + 1 and stock(app, item) == 6


def test_a_twin_committing_another_request_under_the_key_first_makes_it_a_reused_key(
        app: Commitline, elsewhere: Commitline, pg_dsn: str, schema: str, observed: Recorded) -> None:
    item = new_item(app)
    app.store.cache.take(item)
    after_each_read(app, lambda: elsewhere.dispatch(receive(item, 7), idempotency_key="shared"))
    before = count_rows(pg_dsn, schema)

    with pytest.raises(IdempotencyKeyReused) as reused:
        app.dispatch(receive(item, 5), idempotency_key="shared")

    assert reused.value.key == "shared"
    assert count_rows(pg_dsn, schema)["events"] == before["events"] + 1 and stock(app, item) == 8
    assert observed.outcomes[-1] == ("receive_stock", "refused", "idempotency_key_reused")


# -- 5. Conflict re-run ---------------------------------------------------------------------------------------------


def test_without_expected_version_a_stream_moved_under_every_run_is_a_conflict_after_max_attempts(
        app: Commitline, elsewhere: Commitline, observed: Recorded) -> None:
    item = new_item(app)
    app.processor.retry = RetryPolicy(max_attempts=3, base_delay=0, max_delay=0)
    app.store.cache.take(item)
    reads = after_each_read(app, lambda: elsewhere.dispatch(receive(item), idempotency_key=str(uuid4())))

    with pytest.raises(ConcurrencyConflict) as conflict:
        app.dispatch(receive(item, 100), idempotency_key="never")

    assert (conflict.value.expected, conflict.value.actual, conflict.value.attempts) == (None, 4, 3)
    assert reads == [item] * 3 and observed.retries == ["receive_stock"] * 2
    assert stock(app, item) == 4 and app.store.find_outcome("default", "never") is None


def test_with_expected_version_a_race_lost_to_another_tenants_new_stream_is_not_found(
        app: Commitline, elsewhere: Commitline, pg_dsn: str, schema: str, observed: Recorded) -> None:
    item = uuid4()
    after_each_read(app, lambda: elsewhere.dispatch(receive(item), idempotency_key="theirs", tenant="other"))

    with pytest.raises(AggregateNotFound) as refused:
        app.dispatch(receive(item, expected_version=0), idempotency_key="ours")

    # Refused as for an id nobody uses: the version it lost to is read as this tenant, for whom it does not exist.
    assert str(refused.value) == str(AggregateNotFound("InventoryItem", item))
    assert app.store.find_outcome("default", "ours") is None and count_rows(pg_dsn, schema)["events"] == 1
    assert observed.outcomes[-1] == ("receive_stock", "refused", "aggregate_not_found")


# -- 6. A store outage is no refusal: no twin is looked for ---------------------------------------------------------


def test_a_store_outage_while_deciding_never_looks_for_a_twin(
        app: Commitline, observed: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    task = app.dispatch({"type": "create_survey_task", "title": "NPS"}, idempotency_key="t").aggregate_id
    lookups: list[str] = []
    find_outcome = app.processor.store.find_outcome

    def down(*args: object, **kwargs: object) -> object:
        raise StoreUnavailable("down")

    def counted(tenant: str, key: str) -> object:
        lookups.append(key)
        return find_outcome(tenant, key)

    monkeypatch.setattr(app.processor.store, "load", down)  # the task the answer reads
    monkeypatch.setattr(app.processor.store, "find_outcome", counted)

    with pytest.raises(StoreUnavailable):
        app.dispatch({"type": "answer_survey_task", "task_id": str(task), "user_id": "u1"}, idempotency_key="a")

    assert lookups == []
    assert observed.outcomes[-1] == ("answer_survey_task", "failed", "store_unavailable")
