"""The examples' scripted demonstration behind ``make demo`` (``commitline demo``): a short workload on
the settings ``commitline demo`` chose (the embedded store, or only when asked a schema of its own in the
configured database), showing each guarantee happen, then a summary. Written with the public API only.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from uuid import UUID, uuid4

import orjson
from rich.console import Console
from rich.table import Table

from commitline import Commitline, CommitlineError, bootstrap
from commitline.examples import domain
from commitline.examples.fulfilment import OrderFulfilment, fulfilment_id, payment_id_for
from commitline.examples.fulfilment_saga import FulfilmentSaga
from commitline.examples.inventory import InventoryItem
from commitline.examples.orders import Order
from commitline.examples.payments import PaymentTransaction
from commitline.examples.simulated_gateway import SimulatedGateway

console = Console(highlight=False)
if not console.is_terminal:  # piped or captured: wide enough that tables keep their columns
    console = Console(highlight=False, width=120)


def concurrently(n: int, work: Callable[[int], Any]) -> Counter[str]:
    """Run work(i) in n threads released at the same moment; count outcomes by kind."""
    barrier, outcomes = threading.Barrier(n), Counter[str]()
    lock = threading.Lock()

    def body(i: int) -> None:
        barrier.wait()
        try:
            work(i)
            kind = "succeeded"
        except CommitlineError as e:
            kind = type(e).__name__
        with lock:
            outcomes[kind] += 1

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def refused(action: Callable[[], Any]) -> CommitlineError:
    try:
        action()
    except CommitlineError as e:
        return e
    raise AssertionError("the demo expected this command to be refused")


def payments(app: Commitline, run: str) -> tuple[list[tuple[str, str]], list[str]]:
    console.rule("[bold]Payments: CREATED -> PENDING -> COMPLETED | FAILED, FAILED -> PENDING")
    rows = []
    ids = []
    for n, (amount, currency) in enumerate([("120.00", "EUR"), ("75.50", "USD"), ("9800", "JPY")], start=1):
        created = app.dispatch({"type": "create_payment", "amount": amount, "currency": currency,
                                "account": f"acct-{n}"}, idempotency_key=f"{run}-create-{n}")
        ids.append(str(created.aggregate_id))
        app.dispatch({"type": "submit_payment", "payment_id": ids[-1]}, idempotency_key=f"{run}-submit-{n}")
        console.print(f"payment {n}: {amount} {currency} created and submitted (id {ids[-1]})")
    app.dispatch({"type": "complete_payment", "payment_id": ids[0]}, idempotency_key=f"{run}-complete-1")
    app.dispatch({"type": "fail_payment", "payment_id": ids[1], "reason": "card declined"},
                 idempotency_key=f"{run}-fail-2")
    console.print("payment 1 completed; payment 2 failed: card declined")

    error = refused(lambda: app.dispatch({"type": "complete_payment", "payment_id": ids[1]},
                                         idempotency_key=f"{run}-complete-2"))
    console.print(f"[red]refused[/red] {type(error).__name__}: {error}")
    rows.append(("illegal transition FAILED -> COMPLETED", f"{type(error).__name__}, nothing written"))

    retry = {"type": "submit_payment", "payment_id": ids[1]}
    first = app.dispatch(retry, idempotency_key=f"{run}-retry-2")
    again = app.dispatch(retry, idempotency_key=f"{run}-retry-2")
    console.print(f"payment 2 retried (version {first.version}); the same request sent again came back "
                  f"replayed={again.replayed} with version {again.version}: no second event")
    app.dispatch({"type": "complete_payment", "payment_id": ids[1]}, idempotency_key=f"{run}-complete-2b")
    rows.append(("duplicate request, same key", f"replayed={again.replayed}, same outcome, 1 event"))

    reused = refused(lambda: app.dispatch({**retry, "payment_id": ids[2]}, idempotency_key=f"{run}-retry-2"))
    rows.append(("same key, different payload", type(reused).__name__))

    bad = refused(lambda: app.dispatch({"type": "create_payment", "amount": "-5", "currency": "EUR",
                                        "account": "acct"}, idempotency_key=f"{run}-bad"))
    console.print(f"[red]refused[/red] {bad}")
    rows.append(("negative amount", type(bad).__name__))

    contention = concurrently(50, lambda i: app.dispatch(
        {"type": "fail_payment", "payment_id": ids[2], "reason": "timeout", "expected_version": 2},
        idempotency_key=f"{run}-race-{i}"))
    console.print(f"50 concurrent transitions of payment 3 at version 2: {dict(contention)}")
    rows.append(("50 concurrent transitions, one version", ", ".join(f"{k}={v}" for k, v in contention.items())))

    states = Counter(app.load(PaymentTransaction, UUID(i)).state.value for i in ids)
    rows.append(("payment states", ", ".join(f"{k}={v}" for k, v in sorted(states.items()))))
    return rows, ids


def inventory(app: Commitline, run: str) -> list[tuple[str, str]]:
    console.rule("[bold]Inventory: 40 concurrent reservations against 25 units")
    item_id = uuid4()
    app.dispatch({"type": "receive_stock", "item_id": str(item_id), "quantity": 25}, idempotency_key=f"{run}-stock")
    outcomes = concurrently(40, lambda i: app.dispatch(
        {"type": "reserve_stock", "item_id": str(item_id), "reservation_id": f"order-{i}", "quantity": 1},
        idempotency_key=f"{run}-reserve-{i}"))
    item = app.load(InventoryItem, item_id)
    console.print(f"outcomes: {dict(outcomes)}; on hand {item.on_hand}, reserved {item.reserved}, "
                  f"available {item.available}")
    return [("40 reservations vs 25 in stock", ", ".join(f"{k}={v}" for k, v in outcomes.items())),
            ("stock after", f"available={item.available} (never negative)")]


def survey(app: Commitline, run: str) -> tuple[list[tuple[str, str]], str]:
    console.rule("[bold]Survey task: 10,000 users in one command, re-issue, concurrent answers")
    task = app.dispatch({"type": "create_survey_task", "title": "Checkout satisfaction"},
                        idempotency_key=f"{run}-task")
    task_id = str(task.aggregate_id)
    started = time.perf_counter()
    app.dispatch({"type": "issue_survey_task", "task_id": task_id, "user_ids": [f"user-{n}" for n in range(10_000)]},
                 idempotency_key=f"{run}-issue-1")
    issued_in = time.perf_counter() - started
    app.dispatch({"type": "issue_survey_task", "task_id": task_id,
                  "user_ids": [f"user-{n}" for n in range(10_000, 12_000)]}, idempotency_key=f"{run}-issue-2")
    started = time.perf_counter()
    answers = concurrently(500, lambda i: app.dispatch(
        {"type": "answer_survey_task", "task_id": task_id, "user_id": f"user-{i * 7}"},
        idempotency_key=f"{run}-answer-{i}"))
    answered_in = time.perf_counter() - started
    twice = refused(lambda: app.dispatch({"type": "answer_survey_task", "task_id": task_id, "user_id": "user-0"},
                                         idempotency_key=f"{run}-answer-again"))
    console.print(f"issued to 10,000 users in {issued_in * 1000:.0f} ms, re-issued to 2,000 more; "
                  f"500 concurrent answers in {answered_in:.2f} s: {dict(answers)}")
    console.print(f"[red]refused[/red] a second answer from user-0: {twice}")
    return [("issue to 10,000 users", f"1 command, {issued_in * 1000:.0f} ms"),
            ("500 concurrent answers", ", ".join(f"{k}={v}" for k, v in answers.items())),
            ("a user answering twice", type(twice).__name__)], task_id


def log_head(app: Commitline) -> int:
    return app.status().head


def caught_up(app: Commitline, follower: Any, position: int, timeout: float = 120) -> None:
    """Wait until the follower's saved position reaches ``position``, whichever instance got it there: another
    commitline sharing the data folder (a second demo, a running ``project``) may hold its lease."""
    name = follower.follower.lease.name
    deadline = time.monotonic() + timeout
    while True:
        if follower.error is not None:
            raise follower.error
        if any(s.name == name and s.position >= position for s in app.status().followers):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} did not reach position {position} in {timeout:.0f} s")
        time.sleep(0.1)


def kafka_readback(app: Commitline, settings: Any, publisher: Any) -> list[tuple[str, str]]:
    console.rule("[bold]Kafka: every event published in commit order, read back by a consumer")
    head = log_head(app)
    caught_up(app, publisher, head)
    assert publisher.follower is not None
    published = publisher.follower.metrics.events_published
    records = app.published(published, quiet_for=0.5, settings=settings)
    per_topic = Counter(r.topic for r in records)
    for topic, count in sorted(per_topic.items()):
        console.print(f"{topic}: {count} records")
    payments = [r for r in records if r.envelope["aggregate_type"] == "PaymentTransaction"]
    sample = [r for r in payments if r.key == payments[-1].key] if payments else []
    table = Table(title=f"records of payment {sample[0].key if sample else ''} as a consumer reads them")
    for column in ("partition", "offset", "version", "type", "payload", "event_id"):
        table.add_column(column)
    for r in sample:
        table.add_row(str(r.partition), str(r.offset), str(r.envelope["version"]), r.envelope["type"],
                      orjson.dumps(r.envelope["payload"]).decode(), r.envelope["event_id"][:8] + "…")
    console.print(table)
    console.print(followers_table(app))
    # Another commitline sharing the data folder (a second demo, a running `publish`) may hold the publisher's
    # lease and publish some or all of them: only the position says everything is out.
    return [("published to Kafka", f"{published} events by this publisher, {len(records)} records read back, "
                                   f"position {publisher.follower.metrics.position} >= log head {head} when read")]


def followers_table(app: Commitline) -> Table:
    report = app.status()
    table = Table(title=f"commitline followers (log head {report.head})")
    for column in ("follower", "status", "position", "lag (events)"):
        table.add_column(column)
    for s in report.followers:
        table.add_row(s.name, s.status, str(s.position), str(s.lag_events))
    return table


def read_models(app: Commitline, projectors: list[Any], task_id: str) -> list[tuple[str, str]]:
    console.rule("[bold]Read models: built by single-writer projectors from the log, never by commands")
    head = log_head(app)
    for projector in projectors:
        caught_up(app, projector, head)
    models = app.read_models()
    counts = models.task_counts(UUID(task_id))
    console.print(f"survey task {task_id}: {counts}")
    table = Table(title="payments by state and currency (all demo runs in this store)")
    for column in ("state", "currency", "payments", "amount"):
        table.add_column(column)
    for total in models.payment_totals():
        table.add_row(total.state, total.currency, str(total.payments), str(total.amount))
    console.print(table)
    return [("survey task counters", ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))]


def audit(app: Commitline, payment_id: str) -> None:
    console.rule("[bold]Audit: the payment's history replayed, and the hash chains verified")
    auditor = app.auditor()
    history = auditor.history(UUID(payment_id))
    table = Table(title=f"{history.aggregate_type} {payment_id}")
    for column in ("version", "recorded at", "type", "payload", "transition"):
        table.add_column(column)
    for e in history.entries:
        table.add_row(str(e.version), e.recorded_at.strftime("%H:%M:%S.%f"), e.type, orjson.dumps(e.payload).decode(),
                      e.transition or "")
    console.print(table)
    report = auditor.verify()
    verdict = "OK" if report.ok else f"{len(report.broken)} streams BROKEN"
    console.print(f"audit verify --all: {verdict}, {report.streams} streams, {report.events} events "
                  f"in {report.seconds:.2f} s")



def orders(app: Commitline, run: str) -> list[tuple[str, str]]:
    console.rule("[bold]Order saga: reserve -> authorize -> confirm + capture, compensated in reverse on failure")
    gateway = SimulatedGateway(app.conninfo, app.settings.schema_name)
    item = str(uuid4())
    app.dispatch({"type": "receive_stock", "item_id": item, "quantity": 2}, idempotency_key=f"{run}-saga-stock")
    cases = {"happy": "acct-1", "card declined": "acct-2|authorize-declines",
             "capture fails at confirmation": "acct-3|capture-declines",
             "gateway timeout, then the same key": "acct-4|authorize-times-out-once",
             "out of stock": "acct-5"}
    placed = {}
    saga = app.process_manager("order-fulfilment", ports={"payments": gateway}, backoff=0.01)
    with app.background(lambda: app.process_runner(saga, poll_interval=0.1)) as (runner,):
        for case, account in cases.items():
            placed[case] = app.dispatch({"type": "place_order", "item_id": item, "quantity": 1, "amount": "30.00",
                                         "currency": "EUR", "account": account},
                                        idempotency_key=f"{run}-order-{case}").aggregate_id
            caught_up(app, runner, log_head(app))
        caught_up(app, runner, log_head(app))
    table = Table(title="orders")
    for column in ("case", "saga", "order", "payment", "captured at gateway", "why"):
        table.add_column(column)
    ledger = gateway.ledger_rows()
    for case, order_id in placed.items():
        fulfilment = app.load(OrderFulfilment, fulfilment_id(order_id))
        order = app.load(Order, order_id)
        payment = app.load(PaymentTransaction, payment_id_for(order_id))
        captures = ledger.get(FulfilmentSaga.gateway_key(order_id), ("", 0))[1]
        table.add_row(case, fulfilment.state.value, order.state.value, payment.state.value if payment.state else "-",
                      str(captures), fulfilment.failure or "")
    console.print(table)
    compensated = placed["capture fails at confirmation"]
    history = app.auditor().history(fulfilment_id(compensated))
    console.print(f"commitline sagas show {compensated}:")
    for e in history.entries:
        detail = ", ".join(f"{k}={v}" for k, v in e.payload.items() if k != "order_id")
        console.print(f"  {e.version}  {e.type:<24} {detail:<55} {e.transition or ''}")
    item_state = app.load(InventoryItem, UUID(item))
    return [("order sagas", ", ".join(f"{case}: {app.load(OrderFulfilment, fulfilment_id(o)).state.value}"
                                      for case, o in placed.items())),
            ("stock after the sagas", f"on hand {item_state.on_hand}, reserved {item_state.reserved} "
                                      "(only confirmed orders hold stock)")]


def run_demo(settings: Any) -> int:
    """The demo on ``settings`` (``commitline demo`` chose them: embedded, or the configured database's demo
    schema); 0 when every scenario ran."""
    run = uuid4().hex[:8]
    console.print(f"[bold]commitline demo[/bold] (run {run})")
    started = time.perf_counter()
    with bootstrap(settings, domain=domain) as app:
        if unready := app.unready():  # e.g. no master key for the personal fields: refused before any row is written
            for reason in unready:
                print(f"demo: not started, nothing was written: {reason}", file=sys.stderr)
            return 3
        settings = app.start_embedded_kafka_if_unset()
        where = "embedded PostgreSQL " + app.embedded_postgres.dsn if app.embedded_postgres else "configured PostgreSQL"
        broker = "configured Kafka" if app.settings.kafka_bootstrap_servers else "embedded Tansu broker (in memory)"
        console.print(f"event store: {where}, schema {app.settings.schema_name}; "
                      f"publishing to {broker} at {settings.kafka_bootstrap_servers}")
        projectors = [lambda name=name: app.projector(name, poll_interval=0.2) for name in domain.projections]
        with app.background(*projectors) as running:
            with app.background(lambda: app.publisher(settings)) as (publisher,):
                survey_rows, task_id = survey(app, run)
                payment_rows, payment_ids = payments(app, run)
                rows = payment_rows + inventory(app, run) + survey_rows + orders(app, run)
                rows += kafka_readback(app, settings, publisher)
            rows += read_models(app, running, task_id)
        table = Table(title="What happened")
        table.add_column("scenario")
        table.add_column("outcome")
        for scenario, outcome in rows:
            table.add_row(scenario, outcome)
        console.print(table)
        audit(app, payment_ids[1])
        console.print(f"demo took {time.perf_counter() - started:.1f} s")
    return 0
