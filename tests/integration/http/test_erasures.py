"""Erasing data subjects over HTTP, against a real ``commitline serve`` over TCP: only a tenant's administrative
API key (``commitline tenants add T --admin``) may; an ordinary key is refused with 403 ``admin_key_required``
and nothing is erased; the tenant is the key's, never the body's, and another tenant's subjects are neither
touched nor listed; erasing is idempotent; a bad body is a typed error that erases nothing."""

from __future__ import annotations

import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from commitline.http.erasures import ErasedOut, ErasuresOut
from tests.integration.http.conftest import Server, start_server

pytestmark = pytest.mark.integration
ACCOUNT = "DE89370400440532013000"
KEY = re.compile(r"clk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")


def admin_key(server: Server, tenant: str) -> str:
    return server.admin_key(tenant)


def client(server: Server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def create_payment(http: httpx.Client) -> str:
    answer = http.post("/v1/commands", headers={"Idempotency-Key": uuid.uuid4().hex}, json={
        "type": "create_payment", "amount": "9.99", "currency": "EUR", "account": ACCOUNT})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["aggregate_id"])


def account_of(http: httpx.Client, payment: str) -> Any:
    answer = http.get(f"/v1/aggregates/{payment}")
    assert answer.status_code == 200, answer.text
    return answer.json()["state"]["account"]


def erase(http: httpx.Client, body: Any, **options: Any) -> httpx.Response:
    return http.post("/v1/erasures", json=body, **options)


def problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    document = answer.json()
    assert document["code"] == code and document["status"] == status, document
    return document  # type: ignore[no-any-return]


def test_an_administrative_key_erases_its_tenants_subject_and_an_ordinary_key_is_refused(served: Server) -> None:
    ordinary_key, acme_admin = served.key("acme"), admin_key(served, "acme")
    with client(served, ordinary_key) as acme, client(served, acme_admin) as admin:
        payment = create_payment(acme)

        refused = problem(erase(acme, {"subject": payment}), 403, "admin_key_required")
        ordinary_id = KEY.fullmatch(ordinary_key).group(1)  # type: ignore[union-attr]
        assert refused["key_id"] == ordinary_id and refused["tenant"] == "acme"
        assert "--admin" in refused["detail"] and ordinary_key not in refused["detail"]
        problem(acme.get("/v1/erasures"), 403, "admin_key_required")
        assert account_of(acme, payment) == ACCOUNT  # nothing erased

        answer = erase(admin, {"subject": payment})
        assert answer.status_code == 200, answer.text
        done = ErasedOut.model_validate(answer.json())
        admin_id = KEY.fullmatch(acme_admin).group(1)  # type: ignore[union-attr]
        assert (done.tenant, done.subject, len(done.erased)) == ("acme", payment, 1)
        (erasure,) = done.erased
        assert (erasure.tenant, erasure.subject, erasure.erased_by) == ("acme", payment, f"api key {admin_id}")
        assert acme_admin not in answer.text and acme_admin[len("clk_0123456789ab_"):] not in answer.text
        assert account_of(acme, payment) == {"erased": True}  # the serving process forgot the key at once

        assert done.rebuilt == []  # the examples' read models copy no personal value

        again = erase(admin, {"subject": payment})  # idempotent: nothing left to erase, the same 200
        assert again.status_code == 200, again.text
        assert again.json() == {"tenant": "acme", "subject": payment, "erased": [], "rebuilt": []}

        listed = ErasuresOut.model_validate(admin.get("/v1/erasures").json())
        assert listed.tenant == "acme" and [e.subject for e in listed.erasures].count(payment) == 1
        assert listed.erasures[-1] == erasure
        only = admin.get("/v1/erasures", params={"subject": payment}).json()
        assert [e["key_id"] for e in only["erasures"]] == [str(erasure.key_id)]


def test_another_tenants_subject_is_never_touched_nor_listed(served: Server) -> None:
    with client(served, admin_key(served, "acme")) as acme, served.client("beta") as beta, \
            client(served, admin_key(served, "beta")) as beta_admin:
        theirs = create_payment(beta)
        answer = erase(acme, {"subject": theirs})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"tenant": "acme", "subject": theirs, "erased": [], "rebuilt": []}
        # the tenant is the key's: a tenant named in the body is refused, not obeyed
        problem(erase(acme, {"subject": theirs, "tenant": "beta"}), 422, "invalid_body")
        assert account_of(beta, theirs) == ACCOUNT
        assert theirs not in acme.get("/v1/erasures").text

        assert erase(beta_admin, {"subject": theirs}).json()["erased"][0]["tenant"] == "beta"
        assert account_of(beta, theirs) == {"erased": True}
        assert theirs not in acme.get("/v1/erasures").text
        assert [e["tenant"] for e in beta_admin.get("/v1/erasures").json()["erasures"]] == ["beta"]


@pytest.mark.parametrize(("body", "status", "code", "where"), [
    ({}, 422, "invalid_body", ["subject"]),
    ({"subject": "   "}, 422, "invalid_body", ["subject"]),
    ({"subject": 7}, 422, "invalid_body", ["subject"]),
    ({"subject": "a\u0000b"}, 422, "invalid_body", ["subject"]),
    ({"subject": "s", "extra": 1}, 422, "invalid_body", ["extra"]),
    ({**{f"x{n}": 1 for n in range(5_000)}, "subject": 7}, 422, "invalid_body", ["subject"]),  # then 50, and a count
    (["s"], 422, "invalid_body", []),
    (b'{"subject": "first", "subject": "second"}', 422, "invalid_body", ["subject"]),  # which one? neither
    (b"{not json", 400, "malformed_json", []),
])
def test_a_bad_body_is_a_typed_error_and_erases_nothing(served: Server, body: Any, status: int, code: str,
                                                        where: list[str]) -> None:
    with client(served, admin_key(served, "acme")) as admin, served.client("acme") as acme:
        payment = create_payment(acme)
        before = admin.get("/v1/erasures").json()
        if isinstance(body, bytes):
            answer = admin.post("/v1/erasures", content=body, headers={"Content-Type": "application/json"})
        else:
            answer = erase(admin, body)
        document = problem(answer, status, code)
        assert [e["loc"] for e in document["errors"]][:1] == ([where] if code == "invalid_body" else [[]])
        assert len(document["errors"]) <= 51 and len(answer.content) < 20_000, len(answer.content)
        if code == "malformed_json":
            assert document["detail"].startswith("the body is not valid JSON: "), document["detail"]
        assert admin.get("/v1/erasures").json() == before
        assert account_of(acme, payment) == ACCOUNT


def test_any_subject_an_erasure_takes_can_be_looked_up(served: Server) -> None:
    longest = "s" * 4096  # COMMITLINE_MAX_STRING_LENGTH's default, the server's
    with client(served, admin_key(served, "acme")) as admin:
        assert erase(admin, {"subject": longest}).json()["erased"] == []  # no data key: nothing to erase
        found = admin.get("/v1/erasures", params={"subject": longest})
        assert found.status_code == 200 and found.json() == {"tenant": "acme", "erasures": []}, found.text
        too_long = problem(erase(admin, {"subject": longest + "s"}), 422, "invalid_body")
        assert too_long["errors"][0]["loc"] == ["subject"]
        looked_up = problem(admin.get("/v1/erasures", params={"subject": longest + "s"}), 400, "invalid_query")
        assert "4096" in looked_up["detail"]


def test_no_key_a_wrong_key_and_a_wrong_media_type_are_refused(served: Server) -> None:
    with served.client() as anonymous, client(served, admin_key(served, "acme")) as admin:
        problem(anonymous.post("/v1/erasures", json={"subject": "s"}), 401, "unauthorized")
        problem(anonymous.get("/v1/erasures"), 401, "unauthorized")
        problem(admin.post("/v1/erasures", content=b"subject=s",
                           headers={"Content-Type": "application/x-www-form-urlencoded"}),
                415, "unsupported_media_type")


def test_the_description_documents_the_erasure_routes(served: Server) -> None:
    described = httpx.get(f"{served.base_url}/openapi.json", timeout=30).json()
    post, get = described["paths"]["/v1/erasures"]["post"], described["paths"]["/v1/erasures"]["get"]
    for operation in (post, get):
        assert {"200", "401", "403"} <= set(operation["responses"])
        assert operation["security"] == [{"apiKey": []}]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["subject"] and body["additionalProperties"] is False
    assert "422" in post["responses"] and "admin_key_required" in post["responses"]["403"]["description"]
    (lookup,) = get["parameters"]
    assert lookup["schema"]["anyOf"][0]["maxLength"] == body["properties"]["subject"]["maxLength"] == 4096
    with served.client("acme") as acme:  # two routes share the path: a 405 names the methods of both
        for method in ("OPTIONS", "DELETE", "PUT"):
            wrong = acme.request(method, "/v1/erasures")
            assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD, POST", wrong.headers


def test_an_erasure_recomputes_the_read_models_that_copy_personal_values(pg_dsn: str, schema: str,
                                                                        tmp_path: Path) -> None:
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", COMMITLINE_APP="tests.domains.customers:domain")
    try:
        with client(server, server.admin_key("acme")) as admin:
            registered = admin.post("/v1/commands", headers={"Idempotency-Key": "register"}, json={
                "type": "register_customer", "customer_id": "c-1", "email": "ann@example.com"})
            assert registered.status_code == 201, registered.text
            answer = erase(admin, {"subject": "c-1"})
            assert answer.status_code == 200, answer.text
            done = ErasedOut.model_validate(answer.json())
            assert len(done.erased) == 1 and done.rebuilt == ["customer_contacts"]
            customer = admin.get(f"/v1/aggregates/{registered.json()['aggregate_id']}").json()
            assert customer["state"]["email"] == {"erased": True}
    finally:
        server.stop()


def test_erasures_sent_at_once_each_wait_for_the_rebuild_before_them_and_all_succeed(pg_dsn: str, schema: str,
                                                                                     tmp_path: Path) -> None:
    """Each erasure must rebuild the read models after its key is gone; one already running may have read the
    values first, so the others wait for it and run their own (they used to fail with 503 erasure_incomplete)."""
    server = start_server(pg_dsn, schema, tmp_path / "serve.log", COMMITLINE_APP="tests.domains.customers:domain")
    try:
        with client(server, server.admin_key("acme")) as admin:
            for n in range(6):
                registered = admin.post("/v1/commands", headers={"Idempotency-Key": f"register-{n}"}, json={
                    "type": "register_customer", "customer_id": f"c-{n}", "email": f"person{n}@example.com"})
                assert registered.status_code == 201, registered.text
            with ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(lambda n: erase(admin, {"subject": f"c-{n}"}), range(6)))
            assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
            assert all(ErasedOut.model_validate(a.json()).rebuilt == ["customer_contacts"] for a in answers)
        with psycopg.connect(pg_dsn) as conn:
            contacts = conn.execute(f'SELECT * FROM "{schema}".rm_customer_contacts').fetchall()
        assert not any("@example.com" in str(row) for row in contacts), contacts
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        server.stop()
