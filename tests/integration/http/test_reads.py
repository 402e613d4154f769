"""The tenant-scoped read endpoints against ``commitline serve`` over TCP: each answer's shape with real
data (the same documents as ``commitline audit ... --json``), read models before and after the
projections ran, another tenant's ids answering exactly as unused ones, no key 401, bad parameters 400,
and reads writing nothing."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import httpx
import orjson
import psycopg
import pytest

from commitline.composition import bootstrap
from commitline.examples.fulfilment import fulfilment_id, payment_id_for
from commitline.examples import reads as example_shapes
from commitline.http import reads_shapes as shapes
from tests.support import PROJECTIONS
from tests.integration.http.conftest import Server
from tests.support import FollowerThread, count_rows, settings_for, wait_for
from tests.support import configured_gateway, fulfilment_runner, make_saga

A, B = "acme", "globex"


def command(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/v1/commands", json=body, headers={"Idempotency-Key": str(uuid4())})
    assert answer.status_code in (200, 201), answer.text
    return answer.json()  # type: ignore[no-any-return]


def ok(client: httpx.Client, url: str, shape: type[shapes.Shape], **params: Any) -> Any:
    answer = client.get(url, params=params)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    shape.model_validate(answer.json())  # the documented shape, no member more or less
    return answer.json()


def problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert (answer.status_code, answer.headers["content-type"]) == (status, "application/problem+json"), answer.text
    document = answer.json()
    assert (document["status"], document["code"]) == (status, code), document
    return document  # type: ignore[no-any-return]


def cli_json(server: Server, *args: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "commitline.cli", *args], capture_output=True, text=True,
                         env=server.env, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    return orjson.loads(out.stdout)


def payment(client: httpx.Client, amount: str, *moves: str) -> str:
    pid = command(client, {"type": "create_payment", "amount": amount, "currency": "EUR", "account": "acct"})
    for move in moves:
        command(client, {"type": move, "payment_id": pid["aggregate_id"],
                         **({"reason": "declined"} if move == "fail_payment" else {})})
    return str(pid["aggregate_id"])


def test_an_aggregate_its_history_states_diff_and_verification(server: Server, pg_dsn: str, schema: str) -> None:
    acme = server.client(A)
    created = acme.post("/v1/commands", json={"type": "create_payment", "amount": "12.50", "currency": "EUR",
                                              "account": "acct"}, headers={"Idempotency-Key": "p"})
    pid = created.json()["aggregate_id"]
    for move in ("submit_payment", "complete_payment"):
        command(acme, {"type": move, "payment_id": pid})
    before = count_rows(pg_dsn, schema)

    now = ok(acme, created.headers["location"], shapes.AggregateOut)  # Location names the aggregate's resource
    assert (now["aggregate_id"], now["aggregate_type"], now["tenant"], now["version"]) == (
        pid, "PaymentTransaction", A, 3)
    assert now["state"] | {"id": None} == {"id": None, "version": 3, "state": "COMPLETED", "amount": "12.50",
                                            "currency": "EUR", "account": "acct", "attempts": 1,
                                            "failure_reason": None}

    history = ok(acme, f"/v1/aggregates/{pid}/history", shapes.HistoryOut)
    assert history == cli_json(server, "audit", "history", pid, "--json", "--tenant", A)
    assert [(e["version"], e["type"], e["transition"]) for e in history["entries"]] == [
        (1, "PaymentCreated", "payment: (new) -> CREATED"), (2, "PaymentSubmitted", "payment: CREATED -> PENDING"),
        (3, "PaymentCompleted", "payment: PENDING -> COMPLETED")]
    assert history["entries"][-1]["state_after"] == now["state"]
    assert now["recorded_at"] == history["entries"][-1]["recorded_at"]

    second = ok(acme, f"/v1/aggregates/{pid}/state", shapes.StateOut, at_version=2)
    assert second == cli_json(server, "audit", "state", pid, "--at-version", "2", "--tenant", A)
    assert (second["version"], second["state"]["state"]) == (2, "PENDING")
    at = second["recorded_at"]
    assert at.endswith("+00:00")
    in_paris = datetime.fromisoformat(at).astimezone(timezone(timedelta(hours=1))).isoformat()
    for as_of in (at, at.replace("+00:00", "Z"), in_paris):
        assert ok(acme, f"/v1/aggregates/{pid}/state", shapes.StateOut, as_of=as_of) == second, as_of
    an_hour_earlier = acme.get(f"/v1/aggregates/{pid}/state", params={"as_of": at.replace("+00:00", "+01:00")})
    problem(an_hour_earlier, 404, "before_creation")
    # the '+' of an offset typed into a URL unencoded arrives as a space, and still means '+'
    assert acme.get(f"/v1/aggregates/{pid}/state?as_of={at}").json() == second

    diff = ok(acme, f"/v1/aggregates/{pid}/diff", shapes.DiffOut, **{"from": 1, "to": 3})
    assert diff == cli_json(server, "audit", "diff", pid, "--from", "1", "--to", "3", "--tenant", A)
    assert diff["changed"]["state"] == {"from": "CREATED", "to": "COMPLETED"}
    assert [e["version"] for e in diff["events"]] == [2, 3]
    assert ok(acme, f"/v1/aggregates/{pid}/diff", shapes.DiffOut, **{"from": 0, "to": 1})["changed"]["amount"] == {
        "from": "0", "to": "12.50"}

    verified = ok(acme, f"/v1/audit/verify/{pid}", shapes.VerifyOut)
    assert (verified | {"seconds": 0}) == (cli_json(server, "audit", "verify", "--aggregate", pid, "--json",
                                                    "--tenant", A) | {"seconds": 0})
    assert (verified["ok"], verified["streams"], verified["events"], verified["broken"]) == (True, 1, 3, [])
    assert count_rows(pg_dsn, schema) == before, "reads write nothing"

    with psycopg.connect(pg_dsn) as conn:  # a superuser working around the append-only triggers
        conn.execute("SET session_replication_role = replica")
        conn.execute(f'DELETE FROM "{schema}".events WHERE originator_id = %s AND originator_version = 2', (pid,))
    broken = ok(acme, f"/v1/audit/verify/{pid}", shapes.VerifyOut)
    assert (broken["ok"], broken["events"]) == (False, 2)
    assert [(b["aggregate_id"], b["problem"], b["version"]) for b in broken["broken"]] == [(pid, "link", 3)]
    assert (broken | {"seconds": 0}) == (cli_json(server, "audit", "verify", "--aggregate", pid, "--json",
                                                  "--tenant", A) | {"seconds": 0})  # the CLI's document, tenant too
    assert broken["broken"][0]["tenant"] == A


def test_read_models_before_and_after_the_projections_ran(server: Server, pg_dsn: str, schema: str) -> None:
    acme, globex = server.client(A), server.client(B)
    task = command(acme, {"type": "create_survey_task", "title": "survey"})["aggregate_id"]
    command(acme, {"type": "issue_survey_task", "task_id": task, "user_ids": [f"u{n}" for n in range(60)]})
    command(acme, {"type": "answer_survey_task", "task_id": task, "user_id": "u2"})
    full = ok(acme, f"/v1/aggregates/{task}/history", shapes.HistoryOut)["entries"][-1]["state_after"]
    compact = ok(acme, f"/v1/aggregates/{task}/history", shapes.HistoryOut, compact="true")["entries"][-1]
    assert len(full["issued"]) == 60 and compact["state_after"]["issued"] == "<60 items>"
    payments = [payment(acme, "10.00", "submit_payment", "complete_payment"), payment(acme, "2.50"),
                payment(acme, "1.25", "submit_payment", "fail_payment")]
    item = str(uuid4())
    command(acme, {"type": "receive_stock", "item_id": item, "quantity": 7})
    command(acme, {"type": "reserve_stock", "item_id": item, "reservation_id": "r1", "quantity": 2})
    shop = str(uuid4())
    command(acme, {"type": "receive_stock", "item_id": shop, "quantity": 3})
    order = command(acme, {"type": "place_order", "item_id": shop, "quantity": 1, "amount": "25.00",
                           "currency": "EUR", "account": "acct"})["aggregate_id"]
    payment(globex, "99.00")
    with psycopg.connect(pg_dsn) as conn:
        built = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'rm\\_%%'",
                             (schema,)).fetchone()[0]
    assert built == 0, "no projection has run yet"

    # an unbuilt read model answers as an empty one
    problem(acme.get(f"/v1/read-models/task-statuses/{task}"), 404, "aggregate_not_found")
    problem(acme.get(f"/v1/read-models/inventory-levels/{item}"), 404, "aggregate_not_found")
    problem(acme.get(f"/v1/read-models/fulfilments/{order}"), 404, "aggregate_not_found")
    assert ok(acme, "/v1/read-models/payment-totals", example_shapes.PaymentTotalsOut) == {"tenant": A, "totals": []}
    assert ok(acme, "/v1/read-models/fulfilments", example_shapes.FulfilmentsOut) == {"fulfilments": []}

    with bootstrap(settings_for(pg_dsn, schema)) as app:
        saga = make_saga(app, configured_gateway(app), backoff=0.01)
        with FollowerThread(lambda: fulfilment_runner(app, saga, poll_interval=0.2)):
            wait_for(lambda: acme.get(f"/v1/aggregates/{fulfilment_id(UUID(order))}").json().get("state", {})
                     .get("state") == "COMPLETED", "the order's fulfilment to complete")
        head = app.recorder.max_notification_id() or 0
        for name in sorted(PROJECTIONS):
            with FollowerThread(lambda name=name: app.projector(name, poll_interval=0.2)) as projector:
                projector.wait_until_at(head, timeout=60)

    assert ok(acme, f"/v1/read-models/task-statuses/{task}", example_shapes.TaskStatusesOut) == {
        "task_id": task, "statuses": {"DONE": 1, "PENDING": 59}}
    assert ok(acme, f"/v1/read-models/inventory-levels/{item}", example_shapes.InventoryLevelOut) == {
        "item_id": item, "on_hand": 7, "reserved": 2, "available": 5}
    shop_level = ok(acme, f"/v1/read-models/inventory-levels/{shop}", example_shapes.InventoryLevelOut)
    assert shop_level["on_hand"] - shop_level["reserved"] == shop_level["available"] == 2
    fulfilment = {"order_id": order, "tenant": A, "state": "COMPLETED", "failure": "", "stuck": ""}
    assert ok(acme, f"/v1/read-models/fulfilments/{order}", example_shapes.FulfilmentOut) == fulfilment
    assert ok(acme, "/v1/read-models/fulfilments", example_shapes.FulfilmentsOut) == {"fulfilments": [fulfilment]}
    assert ok(acme, "/v1/read-models/fulfilments", example_shapes.FulfilmentsOut, stuck="true") == {"fulfilments": []}

    # the totals are the sums of what the aggregates say, the saga's payment for the order included
    expected: Counter[tuple[str, str]] = Counter()
    counts: Counter[tuple[str, str]] = Counter()
    for pid in [*payments, str(payment_id_for(UUID(order)))]:
        state = ok(acme, f"/v1/aggregates/{pid}", shapes.AggregateOut)["state"]
        expected[(state["state"], state["currency"])] += Decimal(state["amount"])  # type: ignore[assignment]
        counts[(state["state"], state["currency"])] += 1
    totals = ok(acme, "/v1/read-models/payment-totals", example_shapes.PaymentTotalsOut)
    assert totals["tenant"] == A
    assert {(t["state"], t["currency"]): (t["payments"], Decimal(t["amount"])) for t in totals["totals"]} == {
        key: (counts[key], amount) for key, amount in expected.items()}
    assert {t["amount"] for t in totals["totals"]} >= {"2.50", "1.25"}, "amounts are decimal strings"
    assert ok(globex, "/v1/read-models/payment-totals", example_shapes.PaymentTotalsOut) == {
        "tenant": B, "totals": [{"state": "CREATED", "currency": "EUR", "payments": 1, "amount": "99.00"}]}
    assert ok(globex, "/v1/read-models/fulfilments", example_shapes.FulfilmentsOut) == {"fulfilments": []}
    for url in (f"/v1/read-models/task-statuses/{task}", f"/v1/read-models/inventory-levels/{item}",
                f"/v1/read-models/fulfilments/{order}"):
        assert_like_unused(globex, url, url.rsplit("/", 1)[1])


def assert_like_unused(client: httpx.Client, url: str, used: str) -> None:
    """``url`` (naming ``used``, another tenant's id) answers exactly as the same url with an unused id."""
    unused = str(uuid4())
    theirs = problem(client.get(url), 404, "aggregate_not_found")
    nobodys = problem(client.get(url.replace(used, unused)), 404, "aggregate_not_found")
    assert orjson.dumps(theirs).decode().replace(used, "ID") == orjson.dumps(nobodys).decode().replace(unused, "ID")


def aggregate_urls(pid: str) -> list[str]:
    return [f"/v1/aggregates/{pid}", f"/v1/aggregates/{pid}/history", f"/v1/aggregates/{pid}/state?at_version=1",
            f"/v1/aggregates/{pid}/diff?from=0&to=1", f"/v1/audit/verify/{pid}"]


def test_keys_and_tenants(server: Server, pg_dsn: str, schema: str) -> None:
    acme, globex = server.client(A), server.client(B)
    pid = payment(acme, "5.00")
    before = count_rows(pg_dsn, schema)
    every = [*aggregate_urls(pid), f"/v1/read-models/task-statuses/{pid}", f"/v1/read-models/inventory-levels/{pid}",
             "/v1/read-models/payment-totals", "/v1/read-models/fulfilments", f"/v1/read-models/fulfilments/{pid}"]
    for url in every:
        for headers in ({}, {"Authorization": "Bearer not-a-key"}, {"Authorization": "Basic x"}):
            answer = server.client().get(url, headers=headers)
            problem(answer, 401, "unauthorized")
            assert answer.headers["www-authenticate"].startswith("Bearer")
    for url in aggregate_urls(pid):
        assert acme.get(url).status_code == 200, url
        assert_like_unused(globex, url, pid)
    assert count_rows(pg_dsn, schema) == before


def test_bad_parameters(server: Server, pg_dsn: str, schema: str) -> None:
    acme = server.client(A)
    pid = payment(acme, "5.00", "submit_payment")
    before = count_rows(pg_dsn, schema)
    other_forms = [pid.replace("-", ""), f"%7B{pid}%7D", f"urn:uuid:{pid}"]  # UUIDs, but not format: uuid's
    for url in [*aggregate_urls("not-a-uuid"), "/v1/read-models/task-statuses/42",
                "/v1/read-models/inventory-levels/x", "/v1/read-models/fulfilments/%00",
                *(url for form in other_forms for url in aggregate_urls(form)),
                *(f"/v1/read-models/task-statuses/{form}" for form in other_forms)]:
        document = problem(acme.get(url), 400, "invalid_query")
        assert document["errors"][0]["loc"][0] == "path", document

    def bad(query: str, loc: list[str], status: int = 400, code: str = "invalid_query") -> dict[str, Any]:
        document = problem(acme.get(f"/v1/aggregates/{pid}/{query}"), status, code)
        if code == "invalid_query":
            assert [e["loc"] for e in document["errors"]] == [loc], document
        return document

    assert acme.get(f"/v1/aggregates/{pid}/state").json()["version"] == 2  # neither: the last version
    assert "both were given" in bad("state?at_version=1&as_of=2026-01-01T00:00:00Z", ["query"])["detail"]
    bad("state?at_version=one", ["query", "at_version"])
    bad("state?at_version=0", ["query", "at_version"])
    assert "no UTC offset" in bad("state?as_of=2026-01-01T00:00:00", ["query", "as_of"])["detail"]
    assert "not an ISO 8601 time" in bad("state?as_of=yesterday", ["query", "as_of"])["detail"]
    bad(f"state?as_of={'9' * 65}", ["query", "as_of"])
    assert bad("state?at_version=3", [], 404, "version_beyond_head")["details"]["head"] == 2
    bad("state?as_of=2001-01-01T00:00:00Z", [], 404, "before_creation")
    bad("diff?from=1", ["query", "to"])
    bad("diff?from=-1&to=1", ["query", "from"])
    assert "after" in bad("diff?from=2&to=1", ["query", "from"])["detail"]
    bad("diff?from=0&to=3", [], 404, "version_beyond_head")
    problem(acme.get("/v1/read-models/fulfilments?stuck=perhaps"), 400, "invalid_query")
    assert count_rows(pg_dsn, schema) == before


def test_a_parameter_the_route_does_not_take_is_refused_not_ignored(server: Server, pg_dsn: str, schema: str) -> None:
    """A typo in a query parameter would otherwise answer as if it had not been sent: the current state for
    ``?at_verison=1``, every row for a misspelt filter of a domain query."""
    acme = server.client(A)
    pid = payment(acme, "5.00", "submit_payment")
    answer = acme.get(f"/v1/aggregates/{pid}/state?at_verison=1")
    document = problem(answer, 400, "invalid_query")
    assert document["errors"] == [{"loc": ["query", "at_verison"], "type": "extra_forbidden",
                                   "msg": "not a parameter of this route (it takes as_of, at_version)"}], document
    assert acme.get(f"/v1/aggregates/{pid}/state?at_version=1").json()["version"] == 1  # the one it takes
    document = problem(acme.get(f"/v1/aggregates/{pid}?x=1&y=2&x=3"), 400, "invalid_query")
    assert [e["loc"] for e in document["errors"]] == [["query", "x"], ["query", "y"]], document  # each once
    assert "it takes no query parameters" in document["detail"]
    problem(acme.get("/v1/read-models/fulfilments?stuk=true"), 400, "invalid_query")  # a domain query's too
    assert acme.get("/v1/read-models/fulfilments?stuck=true").status_code == 200
    problem(server.client().get(f"/v1/aggregates/{pid}?x=1"), 401, "unauthorized")  # no key: 401 first
    problem(server.client().get("/v1/status?x=1"), 400, "invalid_query")  # a route without a key is checked too
    assert server.client().get("/healthz?probe=1").status_code == 200  # probes outside /v1 are left alone
    # a write's too, and nothing is written: POST /v1/commands takes no query parameter
    before = count_rows(pg_dsn, schema)
    posted = problem(acme.post("/v1/commands?dry_run=1", json={"type": "create_payment", "amount": "1.00",
                                                               "currency": "EUR", "account": "a"},
                               headers={"Idempotency-Key": "with-a-query"}), 400, "invalid_query")
    assert posted["errors"][0]["loc"] == ["query", "dry_run"] and "it takes no query parameters" in posted["detail"]
    assert count_rows(pg_dsn, schema) == before
    problem(server.client().post("/v1/commands?dry_run=1", json={}), 401, "unauthorized")  # no key: 401 first

    # a parameter given twice: which one would count is a guess, so neither does
    twice = problem(acme.get(f"/v1/aggregates/{pid}/state?at_version=1&at_version=2"), 400, "invalid_query")
    assert twice["errors"] == [{"loc": ["query", "at_version"], "type": "duplicate_parameter",
                                "msg": "given 2 times: give it once (which one counts would be a guess)"}], twice
    problem(acme.get(f"/v1/aggregates/{pid}/diff?from=0&to=1&to=2"), 400, "invalid_query")
    problem(acme.get("/v1/read-models/fulfilments?stuck=true&stuck=false"), 400, "invalid_query")


def test_an_event_a_newer_release_wrote_is_a_configuration_error_not_an_internal_one(
        server: Server, pg_dsn: str, schema: str) -> None:
    """A server still running the release before meets an event of a type only the newer release declares (a
    rolling upgrade): its reads and commands on that stream answer 503 ``configuration_error`` naming the type,
    with no traceback and nothing written, as for an event stored at a newer class_version."""
    import dataclasses

    from commitline.examples.payments import PaymentSubmitted
    from commitline.infrastructure.store.codec import encode_event

    acme = server.client(A)
    pid = payment(acme, "5.00")
    newer = PaymentSubmitted(event_id=uuid4(), aggregate_id=UUID(pid), version=2,
                             occurred_at=datetime.now(timezone.utc), attempt=1)
    with bootstrap(settings_for(pg_dsn, schema)) as app:  # the newer release's event, as it stored it
        app.recorder.append([dataclasses.replace(encode_event(newer, A), topic="PaymentRestructured")])
    before = count_rows(pg_dsn, schema)
    for answer in (acme.get(f"/v1/aggregates/{pid}"), acme.get(f"/v1/aggregates/{pid}/history"),
                   acme.post("/v1/commands", json={"type": "submit_payment", "payment_id": pid},
                             headers={"Idempotency-Key": str(uuid4())})):
        document = problem(answer, 503, "configuration_error")
        assert "no event class is registered for stored type 'PaymentRestructured'" in document["detail"], document
        assert "run that release" in document["detail"]
    assert count_rows(pg_dsn, schema) == before


def test_the_routes_are_documented(server: Server) -> None:
    spec = httpx.get(f"{server.base_url}/openapi.json").json()
    for path in ("/v1/aggregates/{aggregate_id}", "/v1/aggregates/{aggregate_id}/history",
                 "/v1/aggregates/{aggregate_id}/state", "/v1/aggregates/{aggregate_id}/diff",
                 "/v1/audit/verify/{aggregate_id}", "/v1/read-models/task-statuses/{task_id}",
                 "/v1/read-models/payment-totals", "/v1/read-models/inventory-levels/{item_id}",
                 "/v1/read-models/fulfilments", "/v1/read-models/fulfilments/{order_id}"):
        operation = spec["paths"][path]["get"]
        assert operation["summary"] and "422" not in operation["responses"], path
        assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].startswith(
            "#/components/schemas/"), path
        assert operation["responses"]["401"]["content"]["application/problem+json"], path


@pytest.fixture(autouse=True)
def _quiet_server(server: Server) -> Any:
    """Every test also checks the server logged no traceback (an unexpected 500)."""
    yield
    assert "Traceback" not in server.output(), server.output()
