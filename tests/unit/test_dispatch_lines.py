"""How ``commitline dispatch`` reads its standard input: a line is a command, or an envelope around one (a line
with no ``type`` whose ``command`` is an object), so a domain's command may have a field called ``command``."""

from __future__ import annotations

import io

import orjson

from commitline.application.commands import DEFAULT_LIMITS
from commitline.cli.dispatch import _stdin_requests


def read(*lines: object) -> list[tuple[object, ...]]:
    stream = io.BytesIO(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    return list(_stdin_requests(None, "default", stream, DEFAULT_LIMITS))


def test_a_command_with_a_field_called_command_is_a_command_and_an_envelope_is_still_one() -> None:
    job = {"type": "queue_job", "command": "echo hi"}
    nested = {"type": "queue_job", "command": {"argv": ["echo", "hi"]}}
    wrapped = {"command": job, "idempotency_key": "k-1", "tenant": "acme"}
    (first, second, third) = read(job, nested, wrapped)
    assert first[1] == job and str(first[2]).startswith("sha256:") and first[3] == "default"
    assert second[1] == nested and str(second[2]).startswith("sha256:")
    assert third[1:] == (job, "k-1", "acme")


def test_an_envelope_with_fields_it_does_not_have_is_refused_naming_them() -> None:
    ((_, error, key, _),) = read({"command": {"type": "queue_job"}, "idempotency_key": "k", "key": "x"})
    assert key is None and "an envelope has only command, idempotency_key, tenant" in str(error)
