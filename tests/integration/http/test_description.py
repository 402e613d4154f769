"""What the fuzzing of ``/openapi.json`` first found, each pinned down against a real ``commitline serve``:
the description declares the bearer key, every status and header the server answers with, result schemas,
the Idempotency-Key's limits and commands exactly as strict as the server; HEAD works where GET does, a 405
says what is allowed, a trailing slash is not redirected, and a problem's numbers are numbers."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from jsonschema_rs import Draft202012Validator

from tests.integration.http.conftest import Server

PAYMENT = {"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": "acc-description"}


@pytest.fixture(scope="module")
def description(served: Server) -> dict[str, Any]:
    return httpx.get(f"{served.base_url}/openapi.json", timeout=30).json()  # type: ignore[no-any-return]


def resolved(description: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator({**schema, "components": description["components"]})


def test_every_route_but_the_probes_declares_the_bearer_key_and_its_401(description: dict[str, Any]) -> None:
    assert description["components"]["securitySchemes"]["apiKey"] == {
        "type": "http", "scheme": "bearer", "description": description["components"]["securitySchemes"]["apiKey"][
            "description"]}
    for path, operations in description["paths"].items():
        for method, operation in operations.items():
            open_route = path in ("/healthz", "/readyz", "/metrics", "/v1/status")
            assert ("security" in operation) != open_route, f"{method} {path}"
            if not open_route:
                assert operation["security"] == [{"apiKey": []}]
                assert operation["responses"]["401"]["headers"]["WWW-Authenticate"]["required"] is True
            assert "default" in operation["responses"], f"{method} {path}: other errors undescribed"
            for status, response in operation["responses"].items():
                if status >= "400":
                    assert list(response["content"]) == ["application/problem+json"], f"{method} {path} {status}"


def test_commands_declare_their_statuses_headers_key_and_result(description: dict[str, Any]) -> None:
    post = description["paths"]["/v1/commands"]["post"]
    assert {"200", "201", "400", "401", "404", "409", "413", "415", "422", "503"} <= set(post["responses"])
    assert post["responses"]["201"]["headers"]["Location"]["required"] is True
    assert {"Idempotent-Replayed", "X-Idempotent-Replayed"} <= set(post["responses"]["200"]["headers"])  # both sent
    assert post["responses"]["503"]["headers"]["Retry-After"]["required"] is True
    assert post["responses"]["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CommandResult"}
    (key,) = post["parameters"]
    assert (key["name"], key["required"], key["schema"]["minLength"], key["schema"]["maxLength"]) == (
        "Idempotency-Key", True, 1, 255)
    pattern = re.compile(key["schema"]["pattern"])
    assert pattern.match("order-42") and not pattern.match("clé") and not pattern.match(" k") and not pattern.match("")


def test_a_command_schema_is_as_strict_as_the_server(description: dict[str, Any], acme: httpx.Client) -> None:
    create = description["components"]["schemas"]["CreatePayment"]
    assert create["required"][0] == "type" and create["properties"]["type"]["enum"] == ["create_payment"]
    body = description["paths"]["/v1/commands"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    validator = resolved(description, body)
    refused_by_both = [{**PAYMENT, "amount": 12.5}, {**PAYMENT, "currency": "ZZZ"}, {**PAYMENT, "amount": "12.505"},
                       {k: v for k, v in PAYMENT.items() if k != "type"}, {**PAYMENT, "account": " "},
                       {**PAYMENT, "amount": "1e3"}, {**PAYMENT, "account": "a\u0000b"}]
    for command in refused_by_both:
        assert not validator.is_valid(command), command
        answer = acme.post("/v1/commands", json=command, headers={"Idempotency-Key": str(uuid.uuid4())})
        assert answer.status_code == 422, (command, answer.text)
    for command in (PAYMENT, {**PAYMENT, "currency": "JPY", "amount": "1200"}, {**PAYMENT, "amount": 7}):
        assert validator.is_valid(command), command
        answer = acme.post("/v1/commands", json=command, headers={"Idempotency-Key": str(uuid.uuid4())})
        assert answer.status_code == 201, (command, answer.text)
        assert resolved(description, {"$ref": "#/components/schemas/CommandResult"}).is_valid(answer.json())


def test_head_answers_where_get_does_and_a_405_names_what_is_allowed(served: Server) -> None:
    head = httpx.head(f"{served.base_url}/healthz", timeout=30)
    assert head.status_code == 200 and head.content == b""
    wrong = httpx.request("TRACE", f"{served.base_url}/healthz", timeout=30)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD"
    assert wrong.headers["content-type"] == "application/problem+json"
    posted = httpx.get(f"{served.base_url}/v1/commands", timeout=30)
    assert posted.status_code == 405 and posted.headers["allow"] == "POST"


def test_a_trailing_slash_is_not_found_not_redirected_before_authentication(served: Server) -> None:
    answer = httpx.post(f"{served.base_url}/v1/commands/", json=PAYMENT, headers={"Host": "evil.example"},
                        timeout=30, follow_redirects=False)
    assert answer.status_code == 404 and "location" not in answer.headers
    assert answer.json()["code"] == "not_found"


def test_a_problems_versions_are_numbers(acme: httpx.Client) -> None:
    created = acme.post("/v1/commands", json=PAYMENT, headers={"Idempotency-Key": str(uuid.uuid4())}).json()
    beyond = acme.get(f"/v1/aggregates/{created['aggregate_id']}/state", params={"at_version": 9})
    assert beyond.status_code == 404
    assert (beyond.json()["version"], beyond.json()["head"]) == (9, 1)
    current = acme.get(f"/v1/aggregates/{created['aggregate_id']}/state")  # neither: the last version
    assert current.status_code == 200 and current.json()["version"] == 1
