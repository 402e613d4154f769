"""``commitline dispatch`` with JSON lines on stdin, run as a real process: a line's key comes from its
content (or its envelope), never its position, so re-running the same input never applies a command twice."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any
from uuid import UUID, uuid4

import orjson
import psycopg

from commitline.composition import bootstrap
from commitline.examples.inventory import InventoryItem
from tests.support import count_rows, settings_for

DERIVED = re.compile(r"sha256:[0-9a-f]{64}")


def dispatch(stdin: str, pg_dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    return subprocess.run([sys.executable, "-m", "commitline.cli", "dispatch", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=120)


def results(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert out.returncode == 0, out.stderr[-2000:]
    return [orjson.loads(line) for line in out.stdout.splitlines()]


def stock(pg_dsn: str, schema: str, item: str) -> tuple[int, int]:
    """(on hand, stream version) of the item, read back from the store."""
    with bootstrap(settings_for(pg_dsn, schema, pool_size=1)) as app:
        state = app.store.load(InventoryItem, UUID(item))
    return state.on_hand, state.version


def receive(item: str, quantity: int) -> str:
    return orjson.dumps({"type": "receive_stock", "item_id": item, "quantity": quantity}).decode()


def test_rerunning_the_same_input_applies_each_command_once(pg_dsn: str, schema: str) -> None:
    item, other, third = str(uuid4()), str(uuid4()), str(uuid4())
    line = receive(item, 5)

    (first,) = results(dispatch(line + "\n", pg_dsn, schema))
    assert first["line"] == 1 and first["replayed"] is False and first["result"]["version"] == 1
    key = first["idempotency_key"]
    assert DERIVED.fullmatch(key), key
    assert stock(pg_dsn, schema, item) == (5, 1)

    (again,) = results(dispatch(line + "\n", pg_dsn, schema))
    assert (again["idempotency_key"], again["replayed"]) == (key, True)

    blank_on_top = results(dispatch("\n" + line + "\n", pg_dsn, schema))
    assert [(r["line"], r["idempotency_key"], r["replayed"]) for r in blank_on_top] == [(2, key, True)]
    assert stock(pg_dsn, schema, item) == (5, 1)

    # the same command written with other spacing and key order is the same command
    respelled = '{ "quantity": 5,  "type": "receive_stock", "item_id": "%s" }' % item
    mixed = [receive(other, 1), line, "", receive(third, 2), respelled]
    out = results(dispatch("\n".join(mixed) + "\n", pg_dsn, schema))
    assert [r["line"] for r in out] == [1, 2, 4, 5]
    assert [(r["idempotency_key"] == key, r["replayed"]) for r in out] == [
        (False, False), (True, True), (False, False), (True, True)]

    reordered = results(dispatch("\n".join([receive(third, 2), line, line, receive(other, 1)]), pg_dsn, schema))
    assert [r["replayed"] for r in reordered] == [True, True, True, True]
    assert stock(pg_dsn, schema, item) == (5, 1)
    assert stock(pg_dsn, schema, other) == (1, 1) and stock(pg_dsn, schema, third) == (2, 1)
    assert count_rows(pg_dsn, schema)["events"] == 3


def test_identical_lines_in_one_input_apply_once(pg_dsn: str, schema: str) -> None:
    item = str(uuid4())
    out = results(dispatch("\n".join([receive(item, 3)] * 3), pg_dsn, schema))
    assert [r["replayed"] for r in out] == [False, True, True]
    assert len({r["idempotency_key"] for r in out}) == 1
    assert stock(pg_dsn, schema, item) == (3, 1)


def test_envelopes_with_distinct_keys_apply_identical_commands_twice(pg_dsn: str, schema: str) -> None:
    item = str(uuid4())
    command = {"type": "receive_stock", "item_id": item, "quantity": 4}
    lines = [orjson.dumps({"command": command, "idempotency_key": key}).decode()
             for key in ("delivery-1", "delivery-2")]
    out = results(dispatch("\n".join(lines), pg_dsn, schema))
    assert [(r["idempotency_key"], r["replayed"]) for r in out] == [("delivery-1", False), ("delivery-2", False)]
    again = results(dispatch("\n".join(reversed(lines)), pg_dsn, schema))
    assert [(r["idempotency_key"], r["replayed"]) for r in again] == [("delivery-2", True), ("delivery-1", True)]
    assert stock(pg_dsn, schema, item) == (8, 2)


def test_a_namespace_applies_the_input_once_per_namespace(pg_dsn: str, schema: str) -> None:
    item = str(uuid4())
    line = receive(item, 5) + "\n"
    (plain,) = results(dispatch(line, pg_dsn, schema))
    for namespace in ("ns1", "ns2"):
        (applied,) = results(dispatch(line, pg_dsn, schema, "-k", namespace))
        (replayed,) = results(dispatch("\n\n" + line, pg_dsn, schema, "--idempotency-key", namespace))
        assert applied["idempotency_key"] == replayed["idempotency_key"] == f"{namespace}:{plain['idempotency_key']}"
        assert (applied["replayed"], replayed["replayed"]) == (False, True)
    assert stock(pg_dsn, schema, item) == (15, 3)


def test_the_tenant_is_part_of_a_derived_key(pg_dsn: str, schema: str) -> None:
    line = '{"type": "create_survey_task", "title": "weekly"}\n'
    (default,) = results(dispatch(line, pg_dsn, schema))
    (other,) = results(dispatch(line, pg_dsn, schema, "-t", "acme"))
    assert default["idempotency_key"] != other["idempotency_key"]
    assert (default["replayed"], other["replayed"]) == (False, False)
    assert (default["result"]["tenant"], other["result"]["tenant"]) == ("default", "acme")
    assert default["result"]["aggregate_id"] != other["result"]["aggregate_id"]


def test_a_malformed_line_gets_its_typed_error_and_the_others_run(pg_dsn: str, schema: str) -> None:
    item = str(uuid4())
    lines = [receive(item, 2), '{"type": "receive_stock", "item_id": ', receive(item, 3),
             '{"type": "receive_stock", "item_id": "%s", "quantity": -1}' % item]
    for run in range(2):
        out = dispatch("\n".join(lines) + "\n", pg_dsn, schema)
        assert out.returncode == 1
        done = [orjson.loads(line) for line in out.stdout.splitlines()]
        assert [(r["line"], r["replayed"]) for r in done] == [(1, run == 1), (3, run == 1)]
        errors = [orjson.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
        assert [(e["line"], e["code"]) for e in errors] == [(2, "invalid_command"), (4, "invalid_command")]
        assert "idempotency_key" not in errors[0]  # not JSON: no command, so no key
        assert errors[0]["details"]["errors"][0]["type"] == "json_invalid"
        assert DERIVED.fullmatch(errors[1]["idempotency_key"])
        assert errors[1]["details"]["errors"][0]["loc"] == ["quantity"]
    assert stock(pg_dsn, schema, item) == (5, 2)


def test_an_unusable_namespace_is_refused_before_anything_is_written(pg_dsn: str, schema: str) -> None:
    for namespace in ("x" * 184, "", "k\x01"):
        out = dispatch(receive(str(uuid4()), 1) + "\n", pg_dsn, schema, "-k", namespace)
        assert out.returncode == 2 and out.stdout == ""
        assert orjson.loads(out.stderr.strip().splitlines()[-1])["code"] == "invalid_idempotency_key"
    (longest,) = results(dispatch(receive(str(uuid4()), 1) + "\n", pg_dsn, schema, "-k", "x" * 183))
    assert len(longest["idempotency_key"]) == 255


def test_a_refused_namespace_creates_no_schema(pg_dsn: str, schema: str) -> None:
    out = dispatch(receive(str(uuid4()), 1) + "\n", pg_dsn, schema, "-k", "y" * 300)
    assert out.returncode == 2
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert found == (0,)
