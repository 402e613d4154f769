"""Tenants kept apart, on a real PostgreSQL with two real tenants: for every command type, a command
of another tenant on an existing stream is refused exactly as for an id nobody uses and writes nothing,
while the owner's same command succeeds; read models, the audit and the saga are tenant-scoped too."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from uuid import UUID, uuid4

import orjson
import psycopg
import pytest

from commitline.examples import fulfilment as c
from tests.support import COMMAND_TYPES
from tests.support import SAGA_COMMANDS as SAGA_COMMANDS_LIST
from commitline.application.errors import (
    AggregateAlreadyExists,
    AggregateNotFound,
    CommitlineError,
    InvalidCommand,
    InvalidTenant,
)
from commitline.application.dispatching import derived_id, is_derived
from commitline.examples.fulfilment_saga import FulfilmentSaga
from commitline.composition import Commitline, bootstrap
from commitline.examples.fulfilment import fulfilment_id, payment_id_for
from commitline.examples.inventory import InventoryItem
from commitline.examples.surveys import SurveyAssignment, assignment_id
from tests.support import FollowerThread, count_rows, settings_for
from tests.support import configured_gateway, fulfilment_runner, make_saga

A, B = "bank-a", "bank-b"


class Tenant:
    """Dispatches as one tenant, each command under a fresh key."""

    def __init__(self, app: Commitline, name: str):
        self.app, self.name = app, name

    def __call__(self, command: Any) -> UUID:
        return self.app.dispatch(command, idempotency_key=f"k-{uuid4()}", tenant=self.name).aggregate_id

    def payment(self) -> str:
        return str(self({"type": "create_payment", "amount": "10.00", "currency": "EUR", "account": "acc"}))

    def item(self, quantity: int = 10) -> str:
        item = str(uuid4())
        self({"type": "receive_stock", "item_id": item, "quantity": quantity})
        return item

    def task(self, *users: str) -> str:
        task = str(self({"type": "create_survey_task", "title": "t"}))
        if users:
            self({"type": "issue_survey_task", "task_id": task, "user_ids": list(users)})
        return task

    def order(self) -> str:
        return str(self({"type": "place_order", "item_id": self.item(), "quantity": 1, "amount": "5.00",
                         "currency": "EUR", "account": "acct"}))

    def saga(self, *records: c.Command) -> str:
        order = self.order()
        self(c.StartFulfilment(order_id=UUID(order)))
        for record in records:
            self(record.model_copy(update={"order_id": UUID(order)}))
        return order


@dataclass(frozen=True)
class Case:
    """``setup`` creates what the command needs under tenant A and returns the command A may send;
    ``ids`` are the fields naming A's aggregates."""

    setup: Callable[[Tenant], Any]
    ids: tuple[str, ...]


def _pay(kind: str, **extra: Any) -> Case:
    return Case(lambda a: {"type": kind, "payment_id": a.payment(), **extra}, ("payment_id",))


def _submitted(kind: str, **extra: Any) -> Case:
    def setup(a: Tenant) -> dict:
        payment = a.payment()
        a({"type": "submit_payment", "payment_id": payment})
        return {"type": kind, "payment_id": payment, **extra}

    return Case(setup, ("payment_id",))


def _reserved(kind: str) -> Case:
    def setup(a: Tenant) -> dict:
        item = a.item()
        a({"type": "reserve_stock", "item_id": item, "reservation_id": "r1", "quantity": 1})
        return {"type": kind, "item_id": item, "reservation_id": "r1"}

    return Case(setup, ("item_id",))


def _saga(command: c.SagaCommand, *before: c.Command) -> Case:
    return Case(lambda a: command.model_copy(update={"order_id": UUID(a.saga(*before))}), ("order_id",))


NO_ORDER = UUID(int=0)  # replaced by the saga's order in ``Tenant.saga``
FAILED = c.RecordFulfilmentFailure(order_id=NO_ORDER, step="reserve", reason="out of stock")
UNDONE = c.RecordCompensation(order_id=NO_ORDER, step="reserve", detail="nothing reserved")
STUCK = c.MarkFulfilmentStuck(order_id=NO_ORDER, step="reserve", reason="store down", attempts=3)

# Commands on existing streams (or reading one): refused to another tenant exactly as for an unused id.
ON_EXISTING: dict[str, Case] = {
    "submit_payment": _pay("submit_payment"),
    "submit_payment with expected_version": _pay("submit_payment", expected_version=1),
    "complete_payment": _submitted("complete_payment"),
    "fail_payment": _submitted("fail_payment", reason="declined"),
    "reserve_stock": Case(lambda a: {"type": "reserve_stock", "item_id": a.item(), "reservation_id": "r1",
                                     "quantity": 1}, ("item_id",)),
    "release_reservation": _reserved("release_reservation"),
    "fulfil_reservation": _reserved("fulfil_reservation"),
    "issue_survey_task": Case(lambda a: {"type": "issue_survey_task", "task_id": a.task(), "user_ids": ["u1"]},
                              ("task_id",)),
    "answer_survey_task": Case(lambda a: {"type": "answer_survey_task", "task_id": a.task("u1"), "user_id": "u1"},
                               ("task_id",)),
    "close_survey_task": Case(lambda a: {"type": "close_survey_task", "task_id": a.task()}, ("task_id",)),
    "cancel_order": Case(lambda a: {"type": "cancel_order", "order_id": a.order(), "reason": "r"}, ("order_id",)),
    "confirm_order": Case(lambda a: {"type": "confirm_order", "order_id": a.order()}, ("order_id",)),
    "start_fulfilment": Case(lambda a: c.StartFulfilment(order_id=UUID(a.order())), ("order_id",)),
    "record_fulfilment_step": _saga(c.RecordFulfilmentStep(order_id=NO_ORDER, step="reserve", detail="1 reserved")),
    "record_fulfilment_failure": _saga(FAILED),
    "record_compensation": _saga(UNDONE, FAILED),
    "record_fulfilment_cancelled": _saga(c.RecordFulfilmentCancelled(order_id=NO_ORDER, reason="r"), FAILED, UNDONE),
    "mark_fulfilment_stuck": _saga(STUCK, FAILED),
    "retry_fulfilment": _saga(c.RetryFulfilment(order_id=NO_ORDER), FAILED, STUCK),
    "park_fulfilment": _saga(c.ParkFulfilment(order_id=NO_ORDER, reason="adapter bug", attempts=2)),
    "cancel_order_after_failure": Case(lambda a: c.CancelOrderAfterFailure(order_id=UUID(a.order()), reason="r"),
                                       ("order_id",)),
}
# Commands that would start the stream at an id another tenant's stream has.
CREATING: dict[str, tuple[Callable[[Tenant], Any], str]] = {
    "create_payment": (lambda a: {"type": "create_payment", "payment_id": a.payment(), "amount": "1.00",
                                  "currency": "EUR", "account": "acc"}, "payment_id"),
    "create_survey_task": (lambda a: {"type": "create_survey_task", "task_id": a.task(), "title": "t"}, "task_id"),
    "place_order": (lambda a: {"type": "place_order", "order_id": a.order(), "item_id": str(uuid4()), "quantity": 1,
                               "amount": "5.00", "currency": "EUR", "account": "acct"}, "order_id"),
}
STARTING_OR_CONTINUING = {"receive_stock"}


def test_the_table_covers_every_command_type() -> None:
    every = {cls.model_fields["type"].default for cls in (*COMMAND_TYPES.values(), *SAGA_COMMANDS_LIST)}
    covered = {kind.split(" ")[0] for kind in ON_EXISTING} | set(CREATING) | STARTING_OR_CONTINUING
    assert covered == every


def _as_mapping(command: Any) -> dict:
    return command.model_dump(mode="json") if isinstance(command, c.Command) else dict(command)


def _refusal(app: Commitline, command: Any, tenant: str) -> CommitlineError:
    with pytest.raises(CommitlineError) as refused:
        app.dispatch(command, idempotency_key=f"k-{uuid4()}", tenant=tenant)
    return refused.value


def _names(command: dict, fields: tuple[str, ...]) -> dict[str, str]:
    """The ids a command names (and the saga ids derived from an order id), each with a placeholder."""
    names = {command[field]: f"<{field}>" for field in fields}
    if "order_id" in fields:
        names[str(fulfilment_id(UUID(command["order_id"])))] = "<saga>"
    return names


def _shown(error: CommitlineError, ids: dict[str, str]) -> tuple[str, str, str]:
    """The error as a caller sees it, with the given ids replaced by their names."""
    text = (type(error).__name__, str(error), orjson.dumps(error.details()).decode())
    for value, name in ids.items():
        text = tuple(part.replace(value, name) for part in text)  # type: ignore[assignment]
    return text  # type: ignore[return-value]


SAGA_COMMANDS = {cls.model_fields["type"].default: cls for cls in SAGA_COMMANDS_LIST}


def _internal(command: dict) -> Any:
    """Public commands as JSON-like mappings; the saga's own commands (never accepted as JSON) as models."""
    return SAGA_COMMANDS[command["type"]](**command) if command["type"] in SAGA_COMMANDS else command


@pytest.mark.parametrize("kind", list(ON_EXISTING))
def test_another_tenants_stream_does_not_exist_for_any_command(app: Commitline, pg_dsn: str, schema: str,
                                                               kind: str) -> None:
    case = ON_EXISTING[kind]
    command = _as_mapping(case.setup(Tenant(app, A)))
    unused = {**command, **{field: str(uuid4()) for field in case.ids}}
    before = count_rows(pg_dsn, schema)

    foreign = _refusal(app, _internal(command), B)
    missing = _refusal(app, _internal(unused), B)

    assert isinstance(foreign, AggregateNotFound)
    assert _shown(foreign, _names(command, case.ids)) == _shown(missing, _names(unused, case.ids))
    assert count_rows(pg_dsn, schema) == before, "a refused command writes no event and no idempotency record"
    result = app.dispatch(_internal(command), idempotency_key=f"owner-{kind}", tenant=A)
    assert result.tenant == A and all(e.tenant == A for e in result.events)


@pytest.mark.parametrize("kind", list(CREATING))
def test_a_create_on_an_id_another_tenant_uses_is_refused_without_saying_whose(
        app: Commitline, pg_dsn: str, schema: str, kind: str) -> None:
    setup, field = CREATING[kind]
    command = setup(Tenant(app, A))
    before = count_rows(pg_dsn, schema)

    refused = _refusal(app, command, B)

    assert isinstance(refused, InvalidCommand)
    assert [(e["loc"], e["type"]) for e in refused.details()["errors"]] == [([field], "id_unavailable")]
    shown = str(refused) + orjson.dumps(refused.details()).decode()
    assert "exist" not in shown and A not in shown and "version" not in shown
    assert count_rows(pg_dsn, schema) == before
    # The owner is told what it always was; another tenant's free id is created as usual.
    assert isinstance(_refusal(app, command, A), AggregateAlreadyExists)
    created = app.dispatch({**command, field: str(uuid4())}, idempotency_key=f"fresh-{kind}", tenant=B)
    assert created.tenant == B


def test_no_tenant_can_take_another_tenants_derived_id_first_nor_learn_which_keys_it_used(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    """A creation without an id gets one derived from (tenant, idempotency key), which anyone who knows the
    tenant's name and a key it uses (an order number) can work out. No command may start a stream at an id of
    that form but its own: the same refusal whether the id is held or free, and the owner's creation is not
    blocked."""
    create = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-42"}
    used = app.dispatch(create, idempotency_key="order-1000-payment", tenant=B).aggregate_id
    free = derived_id(B, "order-1001-payment")
    assert is_derived(used) and is_derived(free) and not is_derived(uuid4())
    before = count_rows(pg_dsn, schema)
    answers = []
    for taken in (used, free):
        for command in ({**create, "payment_id": str(taken)},
                        {"type": "receive_stock", "item_id": str(taken), "quantity": 1}):
            refused = _refusal(app, command, A)
            answers.append(_shown(refused, {str(taken): "<id>"}))
            assert isinstance(refused, InvalidCommand) and refused.details()["errors"][0]["type"] == "id_unavailable"
    assert answers[:2] == answers[2:], "held or free, the answer is the same"
    assert count_rows(pg_dsn, schema) == before
    made = app.dispatch(create, idempotency_key="order-1001-payment", tenant=B)
    assert made.aggregate_id == free and made.tenant == B
    own = derived_id(B, "order-1002-payment")  # a command may name the id its own key derives
    named = app.dispatch({**create, "payment_id": str(own)}, idempotency_key="order-1002-payment", tenant=B)
    assert named.aggregate_id == own


def test_receiving_stock_for_another_tenants_item_is_refused_as_not_found(app: Commitline, pg_dsn: str,
                                                                         schema: str) -> None:
    item = Tenant(app, A).item(quantity=5)
    before = count_rows(pg_dsn, schema)
    for command in ({"type": "receive_stock", "item_id": item, "quantity": 1},
                    {"type": "receive_stock", "item_id": item, "quantity": 1, "expected_version": 0}):
        refused = _refusal(app, command, B)
        assert refused.to_dict() == AggregateNotFound("InventoryItem", UUID(item)).to_dict()
    assert count_rows(pg_dsn, schema) == before
    Tenant(app, A)({"type": "receive_stock", "item_id": item, "quantity": 1})
    assert app.store.load(InventoryItem, UUID(item)).on_hand == 6


def test_an_answer_already_given_under_another_tenant_stays_invisible(app: Commitline, pg_dsn: str,
                                                                      schema: str) -> None:
    a = Tenant(app, A)
    task = a.task("u1")
    a({"type": "answer_survey_task", "task_id": task, "user_id": "u1"})  # the assignment stream exists now
    before = count_rows(pg_dsn, schema)
    foreign = _refusal(app, {"type": "answer_survey_task", "task_id": task, "user_id": "u1"}, B)
    unused = str(uuid4())
    missing = _refusal(app, {"type": "answer_survey_task", "task_id": unused, "user_id": "u1"}, B)
    assert _shown(foreign, {task: "<task>"}) == _shown(missing, {unused: "<task>"})
    assert count_rows(pg_dsn, schema) == before
    assert app.store.load(SurveyAssignment, assignment_id(UUID(task), "u1")).version == 1


def test_the_type_of_another_tenants_stream_is_not_revealed(app: Commitline) -> None:
    payment = Tenant(app, A).payment()
    unused = str(uuid4())
    command = {"type": "reserve_stock", "item_id": payment, "reservation_id": "r", "quantity": 1}
    foreign = _refusal(app, command, B)
    missing = _refusal(app, {**command, "item_id": unused}, B)
    assert _shown(foreign, {payment: "<id>"}) == _shown(missing, {unused: "<id>"})
    assert "PaymentTransaction" not in str(foreign)


def test_snapshot_based_loads_know_the_owner(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema, snapshot_interval=2)) as app:
        a = Tenant(app, A)
        payment = a.payment()
        a({"type": "submit_payment", "payment_id": payment})  # version 2: a snapshot, and no event after it
        assert count_rows(pg_dsn, schema)["snapshots"] == 1
        snapshot, tail, _ = app.recorder.load_stream(UUID(payment), after_snapshot=True)
        assert snapshot is not None and tail == []
        before = count_rows(pg_dsn, schema)
        refused = _refusal(app, {"type": "complete_payment", "payment_id": payment}, B)
        assert refused.to_dict() == AggregateNotFound("PaymentTransaction", UUID(payment)).to_dict()
        assert count_rows(pg_dsn, schema) == before
        assert app.dispatch({"type": "complete_payment", "payment_id": payment}, idempotency_key="done",
                            tenant=A).version == 3


def _drain_projections(app: Commitline) -> None:
    head = app.recorder.max_notification_id() or 0
    threads = [FollowerThread(lambda name=name: app.projector(name, poll_interval=0.2))
               for name in ("task_statuses", "payment_states", "inventory_levels")]
    for thread in threads:
        with thread:
            thread.wait_until_at(head, timeout=60)


def test_read_models_answer_only_the_owner(app: Commitline) -> None:
    a, b = Tenant(app, A), Tenant(app, B)
    payment, item, task = UUID(a.payment()), UUID(a.item(quantity=7)), UUID(a.task("u1", "u2"))
    b.payment()
    _drain_projections(app)
    models = app.read_models()

    assert models.payment_state(payment, A) == "CREATED"
    assert models.inventory_level(item, A).available == 7  # type: ignore[union-attr]
    assert models.task_counts(task, A) == {"PENDING": 2, "DONE": 0}
    assert (models.payment_state(payment, B), models.inventory_level(item, B), models.task_counts(task, B)) == (
        None, None, {})
    assert (models.payment_state(payment), models.inventory_level(item), models.task_counts(task)) == (
        None, None, {}), "the default tenant is a tenant like any other"
    assert [(t.tenant, t.payments) for t in models.payment_totals(B)] == [(B, 1)]
    assert {t.tenant for t in models.payment_totals(None)} == {A, B}
    assert models.tenant_task_counts(B) == {}
    with pytest.raises(InvalidTenant):
        models.payment_state(payment, "no spaces")


def test_the_audit_answers_only_the_owner(app: Commitline) -> None:
    a = Tenant(app, A)
    payment = a.payment()
    a({"type": "submit_payment", "payment_id": payment})
    pid, unused = UUID(payment), uuid4()
    audit = app.auditor()
    now = datetime.now(timezone.utc)
    questions: dict[str, Callable[[UUID, str], Any]] = {
        "history": lambda i, t: audit.history(i, tenant=t),
        "state at version": lambda i, t: audit.state_at_version(i, 1, tenant=t),
        "state as of": lambda i, t: audit.state_as_of(i, now, tenant=t),
        "diff": lambda i, t: audit.diff(i, 1, 2, tenant=t),
        "verify": lambda i, t: audit.verify(i, tenant=t),
    }
    for name, ask in questions.items():
        assert ask(pid, A) is not None, name
        for tenant in (B, "default"):
            with pytest.raises(AggregateNotFound) as foreign:
                ask(pid, tenant)
            with pytest.raises(AggregateNotFound) as missing:
                ask(unused, tenant)
            assert _shown(foreign.value, {payment: "<id>"}) == _shown(missing.value, {str(unused): "<id>"}), name
    assert audit.history(pid, tenant=A).tenant == A
    assert audit.verify().ok and audit.verify().streams == 1  # the operator's whole-store check


def _cli(args: list[str], pg_dsn: str, schema: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_the_audit_cli_asks_as_a_tenant(app: Commitline, pg_dsn: str, schema: str) -> None:
    payment = Tenant(app, A).payment()
    unused = str(uuid4())
    owner = _cli(["audit", "history", payment, "--json", "--tenant", A], pg_dsn, schema)
    assert owner.returncode == 0, owner.stderr
    assert orjson.loads(owner.stdout)["tenant"] == A
    for args in (["audit", "history", "{id}"], ["audit", "state", "{id}", "--at-version", "1"],
                 ["audit", "diff", "{id}", "--from", "0", "--to", "1"], ["audit", "verify", "--aggregate", "{id}"]):
        foreign = _cli([a.format(id=payment) for a in args] + ["-t", B], pg_dsn, schema)
        missing = _cli([a.format(id=unused) for a in args] + ["-t", B], pg_dsn, schema)
        assert (foreign.returncode, foreign.stdout) == (2, ""), (args, foreign.stderr)
        assert foreign.stderr.replace(payment, "<id>") == missing.stderr.replace(unused, "<id>"), args
        default = _cli([a.format(id=payment) for a in args], pg_dsn, schema)
        assert default.returncode == 2, "without --tenant the question is asked as the default tenant"


def test_sagas_cli_acts_as_the_orders_tenant(app: Commitline, pg_dsn: str, schema: str) -> None:
    order = Tenant(app, A).saga(FAILED, STUCK)
    foreign = _cli(["sagas", "retry", order, "-t", B], pg_dsn, schema)
    assert foreign.returncode == 1 and "aggregate_not_found" in foreign.stderr
    shown = _cli(["sagas", "show", order, "--json", "-t", A], pg_dsn, schema)
    assert shown.returncode == 0 and [e["type"] for e in orjson.loads(shown.stdout)][-1] == "FulfilmentStuck"
    retried = _cli(["sagas", "retry", order, "--tenant", A], pg_dsn, schema)
    assert retried.returncode == 0, retried.stderr


def _events_by_tenant(pg_dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT convert_from(state, 'UTF8')::jsonb ->> 'tenant', count(*) FROM {schema}.events "
                            "GROUP BY 1").fetchall()
    return dict(rows)


@pytest.mark.parametrize("account", ["acct|authorize-declines", "acct|capture-declines"])
def test_a_failed_order_is_compensated_as_its_tenant(app: Commitline, pg_dsn: str, schema: str,
                                                     account: str) -> None:
    a = Tenant(app, A)
    item = a.item(quantity=3)
    order = a({"type": "place_order", "item_id": item, "quantity": 2, "amount": "25.00", "currency": "EUR",
               "account": account})
    saga = make_saga(app, configured_gateway(app), backoff=0.01)
    with FollowerThread(lambda: fulfilment_runner(app, saga, poll_interval=0.2)):
        deadline = time.monotonic() + 60
        while _saga_events(app, order)[-1:] not in (["FulfilmentCancelled"], ["FulfilmentStuck"]):
            assert time.monotonic() < deadline, f"the saga did not finish: {_saga_events(app, order)}"
            time.sleep(0.05)

    history = app.auditor().history(UUID(item), tenant=A)
    assert [e.type for e in history.entries][-2:] == ["StockReserved", "ReservationReleased"]
    assert history.entries[-1].state_after["on_hand"] == 3 and history.tenant == A
    saga_events = _saga_events(app, order)
    assert "FulfilmentStuck" not in saga_events and saga_events[-1] == "FulfilmentCancelled"
    payment = app.auditor().history(payment_id_for(order), tenant=A)
    assert payment.entries[-1].state_after["state"] == "FAILED"
    assert _events_by_tenant(pg_dsn, schema).keys() == {A}, "every step and compensation is recorded under bank-a"


def _saga_events(app: Commitline, order: UUID) -> list[str]:
    try:
        return [e.type for e in app.auditor().history(fulfilment_id(order), tenant=A).entries]
    except AggregateNotFound:  # not started yet
        return []


def test_the_saga_never_advances_another_tenants_order(app: Commitline, pg_dsn: str, schema: str) -> None:
    order = UUID(Tenant(app, A).order())
    before = count_rows(pg_dsn, schema)
    saga = FulfilmentSaga(app.processor, app.store, {"payments": configured_gateway(app)})
    with pytest.raises(AggregateNotFound):
        saga.advance(order, B)
    assert count_rows(pg_dsn, schema) == before


def test_an_order_for_another_tenants_item_is_compensated_without_touching_it(app: Commitline, pg_dsn: str,
                                                                               schema: str) -> None:
    item = Tenant(app, A).item(quantity=3)
    order = Tenant(app, B)({"type": "place_order", "item_id": item, "quantity": 1, "amount": "5.00",
                            "currency": "EUR", "account": "acct"})
    saga = make_saga(app, configured_gateway(app), backoff=0.01)
    assert saga.advance(order, B).value == "COMPENSATED"
    fulfilment = app.auditor().history(fulfilment_id(order), tenant=B)
    assert "no InventoryItem with id" in fulfilment.entries[1].payload["reason"]
    assert len(app.auditor().history(UUID(item), tenant=A).entries) == 1, "bank-a's item was not touched"
    assert _events_by_tenant(pg_dsn, schema)[A] == 1

