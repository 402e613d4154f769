"""An idempotency key means the same bytes through Python, the CLI and HTTP: white space around it is never
part of it, and anything but printable ASCII (the IETF draft's structured-field string) is refused alike
everywhere. Headers that must come once are refused when they come twice, and a body that is not UTF-8 is a
malformed request. A real ``commitline serve``, real ``commitline dispatch`` processes, and ``bootstrap``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import orjson
import psycopg
import pytest

from commitline import bootstrap
from commitline.application.errors import InvalidIdempotencyKey
from tests.integration.http.conftest import Server
from tests.support import count_rows, settings_for

PAYMENT = {"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "a"}


def cli_dispatch(server: Server, key: str, body: dict[str, object], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commitline.cli", "dispatch", "-t", "acme", "-k", key,
                           orjson.dumps(body).decode(), *args], env=server.env, capture_output=True, text=True,
                          timeout=120)


def raw_post(server: Server, headers: list[tuple[str, bytes]], body: bytes) -> tuple[int, dict[str, str], bytes]:
    """POST /v1/commands written byte for byte on a socket: HTTP clients refuse to send, say, trailing white space
    in a header value, which servers must accept (and drop)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    head = b"".join(name.encode() + b": " + value + b"\r\n" for name, value in headers)
    request = (b"POST /v1/commands HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n"
               b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + head +
               b"\r\n" + body)
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    raw_headers, _, content = rest.partition(b"\r\n\r\n")
    fields = dict(line.decode("latin-1").split(": ", 1) for line in raw_headers.split(b"\r\n") if b": " in line)
    return int(status_line.split()[1]), {k.lower(): v for k, v in fields.items()}, content


def payments(pg_dsn: str, schema: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f"SELECT count(*) FROM {schema}.events WHERE topic = 'PaymentCreated'").fetchone()[0]


def test_one_key_through_python_the_cli_and_http_with_or_without_white_space_executes_once(
        server: Server, pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        first = app.dispatch(PAYMENT, idempotency_key="pay-7 ", tenant="acme")
        again = app.dispatch(PAYMENT, idempotency_key="\tpay-7", tenant="acme")
    assert not first.replayed and again.replayed and again.aggregate_id == first.aggregate_id
    by_cli = cli_dispatch(server, "  pay-7  ", PAYMENT)
    assert by_cli.returncode == 0, by_cli.stderr
    assert orjson.loads(by_cli.stdout)["aggregate_id"] == str(first.aggregate_id)
    key = server.key("acme").encode()
    for sent in (b"pay-7", b"pay-7 ", b"pay-7  ", b"  pay-7\t", b'"pay-7"'):
        status, headers, content = raw_post(server, [("Authorization", b"Bearer " + key), ("Idempotency-Key", sent)],
                                            orjson.dumps(PAYMENT))
        assert status == 201 and headers["idempotent-replayed"] == "true", (sent, content)
        assert orjson.loads(content)["aggregate_id"] == str(first.aggregate_id)
    assert payments(pg_dsn, schema) == 1
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT key FROM {schema}.idempotency_keys").fetchall() == [("pay-7",)]


def test_a_key_that_is_not_printable_ascii_is_refused_alike_everywhere(server: Server, pg_dsn: str,
                                                                       schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        rows = count_rows(pg_dsn, schema)
        with pytest.raises(InvalidIdempotencyKey, match="must be printable ASCII") as refused:
            app.dispatch(PAYMENT, idempotency_key="clé-ü", tenant="acme")
    assert "'é' (U+00E9) at position 2" in str(refused.value)
    by_cli = cli_dispatch(server, "clé-ü", PAYMENT)
    error = orjson.loads(by_cli.stderr)
    assert by_cli.returncode == 1 and error["code"] == "invalid_idempotency_key", by_cli.stderr
    assert "must be printable ASCII" in error["message"]
    with server.client("acme") as http:
        # The header's bytes are UTF-8: the refusal names the character sent, not its Latin-1 reading ('Ã').
        answer = http.post("/v1/commands", json=PAYMENT, headers={"Idempotency-Key": "clé-ü".encode()})
        latin1 = http.post("/v1/commands", json=PAYMENT, headers={"Idempotency-Key": "clé".encode("latin-1")})
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_idempotency_key"
    assert "'é' (U+00E9) at position 2" in answer.json()["detail"], answer.text
    assert latin1.status_code == 400 and "'é' (U+00E9) at position 2" in latin1.json()["detail"], latin1.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert count_rows(pg_dsn, schema) == rows


def test_headers_sent_twice_and_a_body_that_is_not_utf8_are_malformed_requests(server: Server, pg_dsn: str,
                                                                               schema: str) -> None:
    rows = count_rows(pg_dsn, schema)
    acme, globex = server.key("acme"), server.key("globex")
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        twice = http.post("/v1/commands", json=PAYMENT, headers=[
            ("Authorization", f"Bearer {acme}"), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
        assert twice.status_code == 400 and twice.json()["code"] == "duplicate_header"
        assert twice.json()["details"] == {"header": "Idempotency-Key", "count": 2}
        two_tenants = http.post("/v1/commands", json=PAYMENT, headers=[
            ("Authorization", f"Bearer {acme}"), ("Authorization", f"Bearer {globex}"), ("Idempotency-Key", "c")])
        assert two_tenants.status_code == 400 and two_tenants.json()["details"]["header"] == "Authorization"
        latin1 = http.post("/v1/commands", content=b'{"type": "create_payment", "account": "caf\xe9"}', headers={
            "Authorization": f"Bearer {acme}", "Idempotency-Key": "d", "Content-Type": "application/json"})
        assert latin1.status_code == 400 and latin1.json()["code"] == "malformed_json", latin1.text
        assert "not valid UTF-8: byte 0xe9 at position" in latin1.json()["detail"]
    assert count_rows(pg_dsn, schema) == rows


def test_a_json_command_keeps_stderr_for_its_typed_error(pg_dsn: str, schema: str) -> None:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    env.pop("COMMITLINE_LOG_LEVEL", None)
    refused = subprocess.run([sys.executable, "-m", "commitline.cli", "dispatch", "-k", "k", '{"type": "nope"}'],
                             env=env, capture_output=True, text=True, timeout=120)  # a first start: migrations run
    assert refused.returncode == 1 and orjson.loads(refused.stderr)["code"] == "unknown_command_type", refused.stderr
    logged = subprocess.run([sys.executable, "-m", "commitline.cli", "--log-level", "INFO", "dispatch", "-k", "k",
                             '{"type": "nope"}'], env=env, capture_output=True, text=True, timeout=120)
    lines = logged.stderr.strip().splitlines()
    assert " INFO " in lines[0] and orjson.loads(lines[-1])["code"] == "unknown_command_type", logged.stderr


def test_a_quoted_key_is_one_quoted_string_or_refused(server: Server, pg_dsn: str, schema: str) -> None:
    """``"a\\"b"`` is the key a"b; ``"x"y"`` is no quoted string (which key would it be: x"y, or "x"y?), so it is
    refused, not guessed, and nothing is written."""
    key = server.key("acme").encode()

    def send(sent: bytes) -> tuple[int, dict]:
        status, _, content = raw_post(server, [("Authorization", b"Bearer " + key), ("Idempotency-Key", sent)],
                                      orjson.dumps(PAYMENT))
        return status, orjson.loads(content)

    rows = count_rows(pg_dsn, schema)
    for malformed in (b'"x"y"', b'"w\\"', b'""x"', b'"', b' " '):
        status, problem = send(malformed)
        assert (status, problem["code"]) == (400, "invalid_idempotency_key"), (malformed, problem)
        assert "is not one quoted string" in problem["detail"]
    assert count_rows(pg_dsn, schema) == rows
    for sent, stored in ((b'"a\\"b"', 'a"b'), (b'"c\\\\d"', "c\\d"), (b'"e\\f"', "e\\f")):
        status, _ = send(sent)
        assert status == 201, sent
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute(f"SELECT count(*) FROM {schema}.idempotency_keys WHERE key = %s",
                                (stored,)).fetchone() == (1,), (sent, stored)
