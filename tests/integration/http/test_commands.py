"""``POST /v1/commands`` against ``commitline serve`` running as a real subprocess, over TCP with httpx:
created and moved aggregates, byte-identical replays, every refusal as its problem document (with the
row counts unchanged), API keys and tenants, and the body limit on a server started with a small one.

One server serves the whole module (starting one per test costs seconds of CPU on a small machine); each
test uses its own idempotency keys and aggregates and compares row counts before and after itself.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from commitline.composition import bootstrap
from tests.integration.http.conftest import Server, start_server
from tests.support import count_rows, settings_for

PROBLEM_JSON = "application/problem+json"
SECRET_AT = len("clk_0123456789ab_")  # where a key's secret part starts, after its public id
PAYMENT = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-http"}


@pytest.fixture
def rows(pg_dsn: str, module_schema: str) -> Any:
    return lambda: count_rows(pg_dsn, module_schema)


def key() -> str:
    return f"k-{uuid.uuid4()}"


def post(client: httpx.Client, command: Any, idempotency_key: str | None = None, **headers: str) -> httpx.Response:
    """POST a command as JSON (``command`` may be raw bytes), with the given key header (if any)."""
    sent = {"Content-Type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
    if idempotency_key is not None:
        sent["Idempotency-Key"] = idempotency_key
    content = command if isinstance(command, bytes) else orjson.dumps(command)
    return client.post("/v1/commands", content=content, headers=sent)


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response's problem document, checked to be RFC 9457 with this status and code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    document = response.json()
    assert document["status"] == status
    assert document["code"] == code
    assert document["type"] == f"urn:commitline:problem:{code}"
    assert document["instance"] == "/v1/commands"
    assert document["title"] and document["detail"]
    assert "Idempotent-Replayed" not in response.headers and "Location" not in response.headers
    return document


def create_payment(client: httpx.Client) -> str:
    response = post(client, PAYMENT, key())
    assert response.status_code == 201, response.text
    return str(response.json()["aggregate_id"])


def submitted_payment(client: httpx.Client) -> str:
    payment = create_payment(client)
    response = post(client, {"type": "submit_payment", "payment_id": payment, "expected_version": 1}, key())
    assert response.status_code == 200, response.text
    return payment


def refused(rows: Any, response_of: Any, status: int, code: str) -> dict[str, Any]:
    """The problem document of ``response_of()``, which must have written nothing."""
    before = rows()
    document = problem(response_of(), status, code)
    assert rows() == before
    return document


# --------------------------------------------------------------------------- success and replay


def test_a_created_aggregate_answers_201_with_location_and_the_dispatch_result(
        served: Server, acme: httpx.Client, pg_dsn: str, module_schema: str, rows: Any) -> None:
    k = key()
    before = rows()
    first = post(acme, PAYMENT, k)
    assert first.status_code == 201, first.text
    assert first.headers["content-type"] == "application/json"
    body = first.json()
    assert first.headers["Location"] == f"/v1/aggregates/{body['aggregate_id']}"
    assert "Idempotent-Replayed" not in first.headers
    assert body["command_type"] == "create_payment" and body["tenant"] == "acme" and body["version"] == 1
    assert [e["type"] for e in body["events"]] == ["PaymentCreated"]
    assert body["events"][0]["payload"] == {"amount": "12.50", "currency": "EUR", "account": "acc-http"}
    assert "replayed" not in body
    assert rows() == {**before, "events": before["events"] + 1, "idempotency_keys": before["idempotency_keys"] + 1}

    replay = post(acme, PAYMENT, k)
    assert replay.status_code == 201
    assert replay.headers["Location"] == first.headers["Location"]
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert rows() == {**before, "events": before["events"] + 1, "idempotency_keys": before["idempotency_keys"] + 1}

    # the body is what dispatch returns for that key (in-process, same schema, same tenant)
    with bootstrap(settings_for(pg_dsn, module_schema)) as app:
        result = app.dispatch(PAYMENT, idempotency_key=k, tenant="acme")
    assert result.replayed
    assert result.outcome_bytes() == first.content


def test_a_transition_answers_200_and_its_replay_is_byte_identical(acme: httpx.Client, rows: Any) -> None:
    payment = create_payment(acme)
    k = key()
    submit = {"type": "submit_payment", "payment_id": payment, "expected_version": 1}
    first = post(acme, submit, k)
    assert first.status_code == 200, first.text
    assert "Location" not in first.headers and "Idempotent-Replayed" not in first.headers
    body = first.json()
    assert (body["aggregate_id"], body["version"]) == (payment, 2)
    assert [e["type"] for e in body["events"]] == ["PaymentSubmitted"]

    before = rows()
    replay = post(acme, submit, k)
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert "Location" not in replay.headers
    assert replay.content == first.content
    assert rows() == before


def test_a_quoted_key_is_the_same_key(acme: httpx.Client, rows: Any) -> None:
    plain = f"quoted-{uuid.uuid4()}"
    first = post(acme, PAYMENT, f'"{plain}"')
    assert first.status_code == 201
    before = rows()
    replay = post(acme, PAYMENT, plain)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    again = post(acme, PAYMENT, f'"{plain}"')
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert rows() == before


def test_the_same_key_with_another_command_is_refused_422(acme: httpx.Client, rows: Any) -> None:
    k = key()
    first = post(acme, PAYMENT, k)
    assert first.status_code == 201
    document = refused(rows, lambda: post(acme, {**PAYMENT, "amount": "13.00"}, k), 422, "idempotency_key_reused")
    assert document["details"] == {"tenant": "acme", "key": k, "original_command_type": "create_payment",
                                   "command_type": "create_payment"}
    # the first outcome still stands
    assert post(acme, PAYMENT, k).content == first.content


def test_a_key_of_255_characters_is_accepted(acme: httpx.Client) -> None:
    k = ("x" * 255)[:-36] + str(uuid.uuid4())
    assert len(k) == 255
    assert post(acme, PAYMENT, k).status_code == 201


# --------------------------------------------------------------------------- bad requests


@pytest.mark.parametrize(("header", "code"), [
    (None, "missing_idempotency_key"),
    ("", "invalid_idempotency_key"),
    ('""', "invalid_idempotency_key"),
    ('"   "', "invalid_idempotency_key"),  # (unquoted, surrounding spaces are not part of a header value)
    ("k" * 256, "invalid_idempotency_key"),
    (f'"{"k" * 256}"', "invalid_idempotency_key"),
])
def test_a_missing_or_unusable_key_is_refused_400(acme: httpx.Client, rows: Any, header: str | None,
                                                   code: str) -> None:
    document = refused(rows, lambda: post(acme, PAYMENT, header), 400, code)
    assert document["details"]["command_type"] == "POST /v1/commands"
    if code == "missing_idempotency_key":
        assert "Idempotency-Key" in document["detail"]
    if len(header or "") > 255:
        assert "longer than 255" in document["detail"]


@pytest.mark.parametrize("body", [b'{"type": "create_payment", ', b"", b"not json", b'{"a": 1}}', b"\xff\xfe"])
def test_malformed_json_is_refused_400(acme: httpx.Client, rows: Any, body: bytes) -> None:
    document = refused(rows, lambda: post(acme, body, key()), 400, "malformed_json")
    assert document["errors"] and all(e["type"].startswith("json_invalid") for e in document["errors"])
    assert document["details"]["errors"] == document["errors"]


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/json; charset=iso-8859-1"])
def test_a_body_that_is_not_json_is_refused_415(served: Server, rows: Any, content_type: str | None) -> None:
    headers = {"Authorization": f"Bearer {served.key('acme')}", "Idempotency-Key": key()}
    if content_type is not None:
        headers["Content-Type"] = content_type
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        document = refused(rows, lambda: client.post("/v1/commands", content=orjson.dumps(PAYMENT), headers=headers),
                           415, "unsupported_media_type")
    assert document["content_type"] == content_type


def test_a_content_type_sent_twice_is_refused_400(served: Server, rows: Any) -> None:
    """Which one counts would be a guess (as for Authorization and Idempotency-Key): even when the first is JSON."""
    headers = [("Authorization", f"Bearer {served.key('acme')}"), ("Idempotency-Key", key()),
               ("Content-Type", "application/json"), ("Content-Type", "text/plain")]
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        document = refused(rows, lambda: client.post("/v1/commands", content=orjson.dumps(PAYMENT), headers=headers),
                           400, "duplicate_header")
    assert "Content-Type" in document["detail"], document


@pytest.mark.parametrize("coding", ["gzip", "br, identity"])
def test_a_body_under_a_content_coding_is_refused_415_naming_it(served: Server, acme: httpx.Client, rows: Any,
                                                                coding: str) -> None:
    import gzip

    headers = {"Authorization": f"Bearer {served.key('acme')}", "Idempotency-Key": key(),
               "Content-Type": "application/json", "Content-Encoding": coding}
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        document = refused(rows, lambda: client.post("/v1/commands", content=gzip.compress(orjson.dumps(PAYMENT)),
                                                     headers=headers), 415, "unsupported_media_type")
    assert document["content_encoding"] == coding and "no Content-Encoding" in document["detail"], document
    assert post(acme, PAYMENT, key(), Content_Encoding="identity").status_code == 201  # no coding at all


def test_json_with_a_charset_or_a_json_suffix_is_accepted(acme: httpx.Client) -> None:
    for content_type in ("application/json; charset=utf-8", "application/vnd.commitline+json",
                         'application/json;charset="UTF-8"'):
        assert post(acme, PAYMENT, key(), Content_Type=content_type).status_code == 201


def test_every_field_problem_is_listed_422(acme: httpx.Client, rows: Any) -> None:
    bad = {"type": "create_payment", "amount": 12.5, "currency": "EURO", "account": 7, "note": "x", "x": {}}
    document = refused(rows, lambda: post(acme, bad, key()), 422, "invalid_command")
    assert document["command_type"] == "create_payment"
    by_field = {tuple(e["loc"]): e for e in document["errors"]}
    assert set(by_field) == {("amount",), ("currency",), ("account",), ("note",), ("x",)}
    assert "float" in by_field[("amount",)]["msg"]
    assert by_field[("account",)]["type"] == "string_type"
    assert by_field[("note",)]["type"] == by_field[("x",)]["type"] == "extra_forbidden"
    assert document["details"]["errors"] == document["errors"]


def test_a_command_with_thousands_of_problems_is_answered_with_fifty_and_a_count(acme: httpx.Client,
                                                                                rows: Any) -> None:
    bad = {**PAYMENT, **{f"k{n}": 1 for n in range(20_000)}}
    answer = post(acme, bad, key())
    document = refused(rows, lambda: answer, 422, "invalid_command")
    assert len(document["errors"]) == 51 and document["errors"][:50] == [
        {"loc": [f"k{n}"], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"} for n in range(50)]
    assert document["errors"][50] == {"loc": [], "msg": "and 19950 more problems, not listed",
                                      "type": "too_many_problems"}
    assert len(answer.content) < 20_000, len(answer.content)  # the body sent was 160 kB


@pytest.mark.parametrize(("command", "locs"), [
    ({"type": "receive_stock", "item_id": "not-a-uuid", "quantity": "5"}, {("item_id",), ("quantity",)}),
    ({"type": "receive_stock", "item_id": str(uuid.uuid4()), "quantity": 5.5, "expected_version": -1},
     {("quantity",), ("expected_version",)}),
    ({"type": "submit_payment"}, {("payment_id",)}),
    ({"type": "create_payment", "amount": "1.005", "currency": "EUR", "account": "a"}, {("amount",)}),
])
def test_wrong_types_are_refused_422(acme: httpx.Client, rows: Any, command: dict[str, Any],
                                     locs: set[tuple[str, ...]]) -> None:
    document = refused(rows, lambda: post(acme, command, key()), 422, "invalid_command")
    assert {tuple(e["loc"]) for e in document["errors"]} == locs


@pytest.mark.parametrize("command", [{"type": "delete_everything"}, {"amount": "1"}, {"type": 5}])
def test_an_unknown_command_type_is_refused_422(acme: httpx.Client, rows: Any, command: dict[str, Any]) -> None:
    document = refused(rows, lambda: post(acme, command, key()), 422, "unknown_command_type")
    sent = command.get("type")  # shown as text, whatever was sent; null when it names none
    assert document["command_type"] == (str(sent) if sent is not None else None), document
    assert "create_payment" in document["known"] and "complete_payment" in document["known"]


@pytest.mark.parametrize("body", [b"[]", b'"create_payment"', b"42", b"null", b'[{"type": "create_payment"}]'])
def test_a_body_that_is_not_an_object_is_refused_422(acme: httpx.Client, rows: Any, body: bytes) -> None:
    document = refused(rows, lambda: post(acme, body, key()), 422, "invalid_command")
    assert document["errors"] == [{"loc": [], "msg": "a command must be a JSON object", "type": "json_type"}]


# --------------------------------------------------------------------------- refusals by state


def test_a_stale_expected_version_is_409_with_the_actual_version(acme: httpx.Client, rows: Any) -> None:
    payment = submitted_payment(acme)
    command = {"type": "complete_payment", "payment_id": payment, "expected_version": 1}
    document = refused(rows, lambda: post(acme, command, key()), 409, "concurrency_conflict")
    assert (document["aggregate_id"], document["expected_version"], document["actual_version"]) == (payment, 1, 2)
    assert document["details"]["actual_version"] == 2


def test_an_illegal_transition_is_409_naming_the_states(acme: httpx.Client, rows: Any) -> None:
    payment = create_payment(acme)
    command = {"type": "complete_payment", "payment_id": payment}
    document = refused(rows, lambda: post(acme, command, key()), 409, "illegal_transition")
    assert (document["aggregate"], document["current"], document["requested"]) == (
        "PaymentTransaction", "CREATED", "COMPLETED")
    assert document["allowed"] == ["PENDING"]
    assert document["details"] == {"aggregate": "PaymentTransaction", "current": "CREATED",
                                   "requested": "COMPLETED", "allowed": ["PENDING"]}


def test_a_refused_key_may_be_used_again_once_the_state_allows(acme: httpx.Client) -> None:
    payment = create_payment(acme)
    k = key()
    complete = {"type": "complete_payment", "payment_id": payment}
    problem(post(acme, complete, k), 409, "illegal_transition")
    assert post(acme, {"type": "submit_payment", "payment_id": payment}, key()).status_code == 200
    assert post(acme, complete, k).status_code == 200


def test_an_unknown_aggregate_is_404(acme: httpx.Client, rows: Any) -> None:
    unused = str(uuid.uuid4())
    command = {"type": "submit_payment", "payment_id": unused}
    document = refused(rows, lambda: post(acme, command, key()), 404, "aggregate_not_found")
    assert document["details"] == {"aggregate_type": "PaymentTransaction", "aggregate_id": unused}


def test_insufficient_stock_is_409(acme: httpx.Client, rows: Any) -> None:
    item = str(uuid.uuid4())
    received = post(acme, {"type": "receive_stock", "item_id": item, "quantity": 3}, key())
    assert received.status_code == 201
    assert received.headers["Location"] == f"/v1/aggregates/{item}"
    command = {"type": "reserve_stock", "item_id": item, "reservation_id": "r-1", "quantity": 5}
    document = refused(rows, lambda: post(acme, command, key()), 409, "insufficient_stock")
    assert (document["item_id"], document["requested"], document["available"]) == (item, 5, 3)


def test_creating_an_existing_aggregate_is_409(acme: httpx.Client, rows: Any) -> None:
    payment = create_payment(acme)
    command = {**PAYMENT, "payment_id": payment}
    document = refused(rows, lambda: post(acme, command, key()), 409, "aggregate_already_exists")
    assert document["aggregate_id"] == payment


# --------------------------------------------------------------------------- API keys and tenants


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], capture_output=True, text=True,
                          env=server.env, timeout=120)


def unauthorized(response: httpx.Response) -> dict[str, Any]:
    document = problem(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="commitline"'
    return document


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Basic YWNtZTpzZWNyZXQ=", "Token clk_0123456789ab_" + "a" * 43,
    "Bearer clk_0123456789ab_" + "a" * 43, "Bearer not-a-key", "Bearer clk_", "Bearer " + "x" * 5000,
])
def test_no_valid_api_key_is_401(served: Server, rows: Any, authorization: str | None) -> None:
    headers = {"Content-Type": "application/json", "Idempotency-Key": key()}
    if authorization is not None:
        headers["Authorization"] = authorization
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        before = rows()
        response = client.post("/v1/commands", content=orjson.dumps(PAYMENT), headers=headers)
        unauthorized(response)
        assert rows() == before
        if authorization and len(authorization) > 16:
            assert authorization[7:] not in response.text


def test_the_key_is_checked_before_anything_else(served: Server) -> None:
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        unauthorized(client.post("/v1/commands", content=b"{", headers={"Content-Type": "text/plain"}))
    # a well-formed key is read from the database after the request's own checks: an unknown one still wins
    unknown = {"Authorization": "Bearer clk_0123456789ab_" + "a" * 43}
    with httpx.Client(base_url=served.base_url, timeout=60, headers=unknown) as client:
        unauthorized(client.post("/v1/commands", content=b"{", headers={"Content-Type": "text/plain"}))
        unauthorized(post(client, PAYMENT))  # no Idempotency-Key
        unauthorized(post(client, b"{", key()))  # malformed JSON


def test_a_revoked_key_is_refused_from_the_next_request(served: Server, rows: Any) -> None:
    tenant = f"rev-{uuid.uuid4().hex[:8]}"
    old, new = served.key(tenant), cli(served, "tenants", "add", tenant).stdout.strip()
    with httpx.Client(base_url=served.base_url, timeout=60, headers={"Authorization": f"Bearer {old}"}) as client:
        assert post(client, PAYMENT, key()).status_code == 201
        old_id = old.split("_")[1]
        revoked = cli(served, "tenants", "revoke", tenant, "--key", old_id)
        assert revoked.returncode == 0, revoked.stderr
        before = rows()
        unauthorized(post(client, PAYMENT, key()))
        assert rows() == before
    with httpx.Client(base_url=served.base_url, timeout=60, headers={"Authorization": f"Bearer {new}"}) as client:
        assert post(client, PAYMENT, key()).status_code == 201  # the tenant's other key still works
        assert cli(served, "tenants", "revoke", tenant).returncode == 0
        unauthorized(post(client, PAYMENT, key()))


def test_another_tenants_aggregate_is_404_like_an_unused_id(served: Server, acme: httpx.Client, rows: Any) -> None:
    payment = create_payment(acme)
    unused = str(uuid.uuid4())
    with served.client("beta") as beta:
        for command in ({"type": "submit_payment", "payment_id": "{id}"},
                        {"type": "fail_payment", "payment_id": "{id}", "reason": "stolen", "expected_version": 1}):
            theirs = refused(rows, lambda c=command: post(beta, {**c, "payment_id": payment}, key()),
                             404, "aggregate_not_found")
            nobodys = refused(rows, lambda c=command: post(beta, {**c, "payment_id": unused}, key()),
                              404, "aggregate_not_found")
            assert orjson.loads(orjson.dumps(theirs).replace(payment.encode(), unused.encode())) == nobodys
        # beta replaying acme's key with acme's command is beta's own first use: no replay of acme's outcome
        k = key()
        submit = {"type": "submit_payment", "payment_id": payment}
        mine = post(acme, submit, k)
        assert mine.status_code == 200
        theirs = refused(rows, lambda: post(beta, submit, k), 404, "aggregate_not_found")
        assert theirs["aggregate_id"] == payment
        # nothing of acme's changed: its payment moves on from version 2
        assert post(acme, {"type": "complete_payment", "payment_id": payment, "expected_version": 2},
                    key()).status_code == 200


def test_no_key_appears_in_the_log_or_any_response(served: Server, acme: httpx.Client) -> None:
    # requests carrying keys, good and bad, through success and refusals
    post(acme, PAYMENT, key())
    post(acme, b"{", key())
    post(acme, {"type": "nope"}, key())
    fake = "clk_0123456789ab_" + "b" * 43
    with httpx.Client(base_url=served.base_url, timeout=60, headers={"Authorization": f"Bearer {fake}"}) as other:
        response = post(other, PAYMENT, key())
        assert fake not in response.text and fake not in str(response.headers)
    keys = [*served.keys.values(), fake]
    assert len(keys) >= 3
    # a key put in a URL by mistake: the access log shows the request line without it, no answer shows it
    unused = "/v1/aggregates/0b5f3c1e-6a0d-4f7e-9c2b-8d4e1a7f3b21"
    for url, status in ((f"{unused}?token={keys[0]}", 400), (f"/v1/nothing/{keys[1]}", 404),
                        (f"{unused}?{keys[2]}=1", 400), (f"/static/{keys[0]}", 404), (f"/docs/static/{keys[1]}", 404)):  # a parameter the route does not take: 400, named
        answer = acme.get(url)
        assert answer.status_code == status and not any(k in answer.text for k in keys), answer.text
    log = served.output()
    assert "?token=clk_<redacted>" in log and "/v1/nothing/clk_<redacted>" in log
    assert "POST /v1/commands" in log  # the access log is on: requests are logged, keys are not
    for secret in keys:
        assert secret not in log
        assert secret[SECRET_AT:] not in log


# --------------------------------------------------------------------------- the tenants list never shows keys


def test_the_keys_table_holds_no_plaintext(served: Server, pg_dsn: str, module_schema: str) -> None:
    served.key("acme")
    with psycopg.connect(pg_dsn) as conn:
        stored = conn.execute(f'SELECT * FROM "{module_schema}".api_keys').fetchall()
    dump = repr(stored)
    for secret in served.keys.values():
        assert secret not in dump and secret[SECRET_AT:] not in dump


# --------------------------------------------------------------------------- body size


@pytest.fixture(scope="module")
def small(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    log: Path = tmp_path_factory.mktemp("small") / "serve.log"
    running = start_server(pg_dsn, name, log, COMMITLINE_HTTP_MAX_BODY_BYTES="2048")
    try:
        yield running, name
    finally:
        running.stop()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def padded(size: int) -> bytes:
    """A create_payment of exactly ``size`` bytes (whitespace pads it: the JSON stays valid)."""
    body = orjson.dumps({**PAYMENT, "account": "acc-pad"})
    return body[:-1] + b" " * (size - len(body)) + b"}"


def test_a_body_within_the_limit_is_accepted(small: tuple[Server, str]) -> None:
    server, _ = small
    with server.client("acme") as client:
        assert post(client, padded(2048), key()).status_code == 201


def test_a_body_over_the_limit_is_413(small: tuple[Server, str], pg_dsn: str) -> None:
    server, schema = small
    with server.client("acme") as client:
        before = count_rows(pg_dsn, schema)
        document = problem(post(client, padded(2049), key()), 413, "body_too_large")
        assert document["limit"] == 2048 and "COMMITLINE_HTTP_MAX_BODY_BYTES" in document["detail"]
        document = problem(post(client, padded(200_000), key()), 413, "body_too_large")
        assert count_rows(pg_dsn, schema) == before
        assert post(client, padded(1500), key()).status_code == 201  # the server still serves
    with httpx.Client(base_url=server.base_url, timeout=60,
                      headers={"Authorization": "Bearer clk_0123456789ab_" + "a" * 43}) as unknown:
        unauthorized(post(unknown, padded(2049), key()))  # an unknown key is told first


def test_a_chunked_body_over_the_limit_is_413(small: tuple[Server, str], pg_dsn: str) -> None:
    server, schema = small
    body = padded(3000)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 1000):
            yield body[start:start + 1000]

    with server.client("acme") as client:
        before = count_rows(pg_dsn, schema)
        response = client.post("/v1/commands", content=chunks(),
                               headers={"Content-Type": "application/json", "Idempotency-Key": key()})
        assert response.request.headers.get("Transfer-Encoding") == "chunked"
        assert "Content-Length" not in response.request.headers
        document = problem(response, 413, "body_too_large")
        assert document["limit"] == 2048
        assert count_rows(pg_dsn, schema) == before
        small_body = padded(1500)
        accepted = client.post("/v1/commands", content=iter([small_body[:700], small_body[700:]]),
                               headers={"Content-Type": "application/json", "Idempotency-Key": key()})
        assert accepted.status_code == 201, accepted.text
