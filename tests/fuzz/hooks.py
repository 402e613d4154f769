"""Schemathesis hooks for fuzzing ``commitline serve`` from its own ``/openapi.json`` (``SCHEMATHESIS_HOOKS``).

- ``problem_document``: a check of our own: every error response is an RFC 9457 problem document with
  commitline's fields, its ``status`` the response's.
- ``nothing_written_on_error``: with ``COMMITLINE_FUZZ_DATABASE_URL`` and ``COMMITLINE_FUZZ_SCHEMA`` set, the
  store's events and idempotency keys are counted before each request (requests run one at a time) and
  again after an error: an error wrote nothing.
- ``before_call``: a valid Idempotency-Key is made unique per request. One key means one command (the
  description says so), and the same key with another command is rightly refused (422
  ``idempotency_key_reused``); a generated client sends a new key per command. Keys the fuzzer makes
  invalid on purpose are sent as generated.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any

import psycopg
import schemathesis
from schemathesis import CheckContext, Response

KEY = re.compile(r"^[!-~]([ -~]{0,253}[!-~])?$")
PROBLEM_FIELDS = {"type", "title", "status", "detail", "code", "details"}


DATABASE, SCHEMA = os.environ.get("COMMITLINE_FUZZ_DATABASE_URL"), os.environ.get("COMMITLINE_FUZZ_SCHEMA")
_rows_before: dict[str, tuple[int, int]] = {}  # case id -> (events, idempotency keys) before its call


def stored_rows() -> tuple[int, int]:
    with psycopg.connect(DATABASE, autocommit=True) as conn:
        row = conn.execute(f'SELECT (SELECT count(*) FROM "{SCHEMA}".events), '
                           f'(SELECT count(*) FROM "{SCHEMA}".idempotency_keys)').fetchone()
    return int(row[0]), int(row[1])


@schemathesis.hook
def before_call(context: Any, case: Any, **kwargs: Any) -> None:
    headers = case.headers or {}
    key = headers.get("Idempotency-Key")
    if isinstance(key, str) and KEY.match(key):
        headers["Idempotency-Key"] = f"{key[:200]}-{uuid.uuid4().hex}"
    if DATABASE and SCHEMA:
        _rows_before[case.id] = stored_rows()


@schemathesis.check
def nothing_written_on_error(ctx: CheckContext, response: Response, case: Any) -> bool | None:
    before = _rows_before.pop(case.id, None)
    if response.status_code < 400 or before is None:
        return None
    after = stored_rows()
    assert after == before, f"{response.status_code} but rows were written: (events, keys) {before} -> {after}"
    return True


@schemathesis.check
def problem_document(ctx: CheckContext, response: Response, case: Any) -> bool | None:
    if response.status_code < 400:
        return None
    media = response.headers.get("content-type", [""])
    media = media[0] if isinstance(media, list) else media
    assert media.startswith("application/problem+json"), f"{response.status_code} answered as {media!r}"
    document = json.loads(response.content)
    assert isinstance(document, dict) and PROBLEM_FIELDS <= set(document), f"not a problem document: {document}"
    assert document["status"] == response.status_code, f"status {document['status']} in a {response.status_code}"
    assert document["type"].startswith("urn:commitline:problem:"), document["type"]
    return True
