"""Bad input through a real store and the real CLI: the typed error naming what was wrong, and nothing
written. The table is the boundary's (tests/unit/test_command_boundary.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import orjson
import pytest

from commitline.application import errors as E
from commitline.composition import Commitline
from tests.support import count_rows
from tests.unit.test_command_boundary import BAD_INPUTS, TASK, assert_refused

ERRORS = {cls.code: cls for cls in (E.InvalidCommand, E.UnknownCommandType, E.MissingIdempotencyKey,
                                    E.InvalidIdempotencyKey, E.InvalidTenant)}


def seed(app: Commitline) -> None:
    """One accepted command, so the store's tables exist and are not empty."""
    app.dispatch(TASK, idempotency_key="seed")


@pytest.mark.parametrize(("command", "key", "tenant", "error", "loc"), BAD_INPUTS)
def test_python_api_refuses_and_writes_nothing(app: Commitline, pg_dsn: str, schema: str, command: Any, key: Any,
                                               tenant: Any, error: type[E.CommitlineError], loc: list | None) -> None:
    seed(app)
    before = count_rows(pg_dsn, schema)
    with pytest.raises(E.CommitlineError) as caught:
        app.dispatch(command, idempotency_key=key, tenant=tenant)
    assert_refused(caught.value, error, loc)
    assert count_rows(pg_dsn, schema) == before


def cli(args: list[str | bytes], pg_dsn: str, schema: str, stdin: bytes = b"",
        **variables: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema, **variables}
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], input=stdin, capture_output=True,
                          env=env, timeout=120)


def refused_lines(out: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    """The JSON errors on stderr, after checking the run exited 1 with no traceback and no result."""
    stderr = out.stderr.decode("utf-8")  # valid UTF-8 even when the input was not
    assert out.returncode == 1, stderr[-2000:]
    assert "Traceback" not in stderr and out.stdout == b""
    return [orjson.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def assert_printed(printed: dict[str, Any], error: type[E.CommitlineError], loc: list | None) -> None:
    assert ERRORS[printed["code"]] is error, printed
    if error is E.InvalidCommand:
        assert printed["details"]["errors"][0]["loc"] == loc, printed


def as_line(command: Any) -> bytes | None:
    """The command as one stdin line, when JSON can carry it (as the same input: keys must be strings)."""
    if isinstance(command, dict) and not all(isinstance(key, str) for key in command):
        return None
    if isinstance(command, bytes):
        line = command
    elif isinstance(command, str):
        line = command.encode("utf-8")
    else:
        try:
            line = json.dumps(command, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError):
            return None
    return None if b"\n" in line else line


def command_cases() -> list[tuple[bytes, type[E.CommitlineError], list | None]]:
    cases = []
    for param in BAD_INPUTS:
        command, key, tenant, error, loc = param.values
        if key == "k" and tenant == "default" and (line := as_line(command)) is not None:
            cases.append((line, error, loc))
    return cases


ENVELOPES = [  # stdin-only shapes: the envelope's own fields go through the same boundary
    (b'{"command": {"type": "create_survey_task", "title": "t"}, "idempotency_key": "e1", "tenant": "t\xff"}',
     E.InvalidCommand, ["tenant"]),
    (b'{"command": {"type": "create_survey_task", "title": "t"}, "idempotency_key": "e2", "tenant": "a b"}',
     E.InvalidTenant, None),
    (b'{"command": {"type": "create_survey_task", "title": "t"}, "idempotency_key": 5}', E.InvalidIdempotencyKey, None),
    (b'{"command": {"type": "create_survey_task", "title": "t"}, "idempotency_key": "e3", "priority": 1}',
     E.InvalidCommand, ["priority"]),
    (b'{"command": {"type": "create_survey_task", "title": "t\\u0000"}, "idempotency_key": "e4"}',
     E.InvalidCommand, ["command", "title"]),
]


def test_cli_stdin_refuses_each_bad_line_and_writes_nothing(app: Commitline, pg_dsn: str, schema: str) -> None:
    cases = command_cases() + ENVELOPES
    assert len(cases) > 40  # most of the table can be written as JSON
    seed(app)
    before = count_rows(pg_dsn, schema)
    out = cli(["dispatch", "-k", "batch"], pg_dsn, schema, stdin=b"\n".join(line for line, _, _ in cases) + b"\n")
    printed = refused_lines(out)
    assert [p["line"] for p in printed] == list(range(1, len(cases) + 1))
    for (line, error, loc), error_printed in zip(cases, printed):
        assert_printed(error_printed, error, loc)
    assert count_rows(pg_dsn, schema) == before


TASK_JSON = b'{"type": "create_survey_task", "title": "t"}'


@pytest.mark.parametrize(
    ("args", "variables", "error", "loc"),
    [
        pytest.param(["-t", b"t\xff", "-k", "k", TASK_JSON], {}, E.InvalidTenant, None, id="invalid UTF-8 tenant"),
        pytest.param(["-t", "a\tb", "-k", "k", TASK_JSON], {}, E.InvalidTenant, None, id="tab in the tenant"),
        pytest.param(["-k", b"k\xff", TASK_JSON], {}, E.InvalidIdempotencyKey, None, id="invalid UTF-8 key"),
        pytest.param(["-k", "k\x01", TASK_JSON], {}, E.InvalidIdempotencyKey, None, id="control character in the key"),
        pytest.param(["-k", "", TASK_JSON], {}, E.InvalidIdempotencyKey, None, id="empty key"),
        pytest.param(["-k", "k", b'{"type": "create_survey_task", "title": "t\xff"}'], {}, E.InvalidCommand,
                     ["title"], id="invalid UTF-8 in the JSON"),
        pytest.param(["-k", "k", b'{"type": "create_survey_task", "title": "t\\u0000"}'], {}, E.InvalidCommand,
                     ["title"], id="NUL in the JSON"),
        pytest.param(["-k", "k", b'{"type": "create_survey_task", "title": "%s"}' % (b"x" * 2000)],
                     {"COMMITLINE_MAX_COMMAND_BYTES": "1024"}, E.InvalidCommand, [], id="larger than the setting"),
        pytest.param(["-k", "k", b'{"type": "create_survey_task", "title": [[[["t"]]]]}'],
                     {"COMMITLINE_MAX_NESTING_DEPTH": "3"}, E.InvalidCommand, ["title", 0, 0],
                     id="deeper than the setting"),
    ],
)
def test_cli_arguments_are_refused_with_a_json_error(app: Commitline, pg_dsn: str, schema: str, args: list,
                                                     variables: dict[str, str], error: type[E.CommitlineError],
                                                     loc: list | None) -> None:
    seed(app)
    before = count_rows(pg_dsn, schema)
    (printed,) = refused_lines(cli(["dispatch", *args], pg_dsn, schema, **variables))
    assert_printed(printed, error, loc)
    assert count_rows(pg_dsn, schema) == before
