"""``POST /v1/erasures`` and ``GET /v1/erasures``: erasing a tenant's data subject over HTTP, and listing its
erasures, for the tenant's administrative API keys only (``commitline tenants add T --admin``).

The tenant is the key's: nothing in the body can name another, and another tenant's subject of the same id is
never touched nor shown. The checks run in this order, each answering with its problem document before anything
is erased: the API key (401), an administrative one (403 ``admin_key_required``), the media type (415), the
body's size (413), the JSON (400 ``malformed_json``), the body's shape (422 ``invalid_body``).

Erasing is idempotent: a subject that has no data key (it never had a personal value, or it was erased already)
answers 200 with ``erased: []``, so a retry after a lost answer is safe; ``GET /v1/erasures?subject=S`` shows
when it was erased. As ``commitline erase`` does, the request then recomputes the read models that may have
copied the subject's values (``rebuilt``), so none shows them once it is answered; when that fails the erasure
still stands and the answer is 503 ``erasure_incomplete``: the same request again finishes it. ``erased_by``
names the API key by its public id (as ``commitline tenants list`` shows it), never the key itself.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from commitline.application.boundary import CommandLimits, at_most, read_json
from commitline.application.errors import InvalidCommand
from commitline.composition import RebuildError, RebuildRunning
from commitline.http.auth import admin_key
from commitline.http.commands import media_type, read_body, utf8_only
from commitline.http.problems import (
    PROBLEM_JSON,
    ErasureIncomplete,
    InvalidBody,
    InvalidQuery,
    MalformedJson,
    as_http_error,
)

router = APIRouter(tags=["personal data"])
log = logging.getLogger(__name__)

#: A subject the store can hold and erase: no NUL (PostgreSQL text cannot), not blank (``erase`` refuses it).
SUBJECT_PATTERN = r"^[^\x00]*[^\x00\s][^\x00]*$"
_SUBJECT = re.compile(SUBJECT_PATTERN)


class ErasureOut(BaseModel):
    """One erased data key: whose it was, when, and which API key erased it; never a personal value."""

    model_config = ConfigDict(extra="forbid")
    tenant: str
    subject: str
    key_id: UUID = Field(description="the deleted data key's id, as Kafka records' sealed values name it")
    erased_at: datetime
    erased_by: str = Field(description="who erased it: `api key <key id>` over HTTP, the operator from the CLI")


class ErasedOut(BaseModel):
    """What one request erased: the subject's erasure, or none when it had no data key."""

    model_config = ConfigDict(extra="forbid")
    tenant: str
    subject: str
    erased: list[ErasureOut] = Field(description="empty when the subject had no data key (never had a personal "
                                     "value, or was erased already): nothing to erase")
    rebuilt: list[str] = Field(description="the read models recomputed because they may have copied the subject's "
                               "values (those receiving personal fields)")


class ErasuresOut(BaseModel):
    """The tenant's erasures, oldest first."""

    model_config = ConfigDict(extra="forbid")
    tenant: str
    erasures: list[ErasureOut]


_PROBLEM = {"content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
_FORBIDDEN = {403: {"description": "an ordinary API key: only the tenant's administrative keys may "
                                   "(code: admin_key_required)", **_PROBLEM},
              # declared so FastAPI does not document its own 422, which this app never sends for a query
              "default": {"description": "any other error, as a problem document", **_PROBLEM}}


def _view(e: Any) -> dict[str, Any]:
    return {"tenant": e.tenant, "subject": e.subject, "key_id": str(e.key_id), "erased_at": e.erased_at.isoformat(),
            "erased_by": e.erased_by}


def _json(value: Any) -> Response:
    return Response(orjson.dumps(value), media_type="application/json")


def subject_of(body: bytes, limits: CommandLimits) -> str:
    """The subject a body names: MalformedJson (400) when it is not JSON, InvalidBody (422) when it is not
    ``{"subject": <1 to max_string_length characters, not blank, no NUL>}``. The JSON is read as a command's
    is (``read_json``): a key given twice is refused, as is whatever a command's limits refuse (a subject
    longer than ``max_string_length``)."""
    utf8_only(body)
    try:
        document = read_json(body, limits)
    except InvalidCommand as e:
        refused = as_http_error(e)
        raise (refused if isinstance(refused, MalformedJson) else InvalidBody(e.errors)) from None
    if not isinstance(document, dict):
        raise InvalidBody([{"loc": [], "msg": 'must be an object: {"subject": "..."}', "type": "model_type"}])
    errors = []  # the subject's problem first: a long list of unknown fields is cut short after it (at_most)
    subject = document.get("subject")
    if "subject" not in document:
        errors.append({"loc": ["subject"], "msg": "is required: the data subject's id", "type": "missing"})
    elif not isinstance(subject, str):
        errors.append({"loc": ["subject"], "msg": "must be a string", "type": "string_type"})
    elif _SUBJECT.fullmatch(subject) is None:
        errors.append({"loc": ["subject"], "msg": "must name a data subject: not blank, no NUL character",
                       "type": "string_pattern_mismatch"})
    errors += [{"loc": [name], "msg": "not a field of an erasure request (only subject)", "type": "extra_forbidden"}
               for name in document if name != "subject"]
    if errors:
        raise InvalidBody(at_most(errors))
    return subject  # type: ignore[return-value]  # a str once no error was found


@router.post(
    "/v1/erasures",
    summary="Erase a data subject of the key's tenant (administrative API keys only)",
    description="Deletes the subject's data key and records the erasure: from then on every personal value "
    "sealed under it reads as erased (`{\"erased\": true}`), in every process once the erasure's notification "
    "reaches it, and in Kafka records opened with `commitline.PersonalRecords`; then recomputes the read models "
    "that may have copied its values (`rebuilt`). Idempotent: a subject with no data key answers 200 with "
    "`erased: []`.",
    responses={200: {"model": ErasedOut, "description": "erased (or nothing to erase: `erased` is empty)"},
               **_FORBIDDEN,
               503: {"description": "the store is unavailable, or the erasure is recorded but recomputing the read "
                                    "models failed: send the same request again (codes: store_unavailable, "
                                    "erasure_incomplete)", **_PROBLEM},
               **{code: {"description": text, **_PROBLEM} for code, text in (
                   (400, "malformed JSON (code: malformed_json)"), (413, "body too large (code: body_too_large)"),
                   (415, "not JSON (code: unsupported_media_type)"),
                   (422, "not {\"subject\": \"...\"} (code: invalid_body)"))}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "additionalProperties": False, "required": ["subject"],
        "properties": {"subject": {"type": "string", "minLength": 1, "pattern": SUBJECT_PATTERN,
                                   "description": "the data subject's id, as the domain's events name it"}}}}}}},
)
async def post_erasure(request: Request, key: Any = Depends(admin_key)) -> Response:
    commitline = request.app.state.commitline
    media_type(request.headers)
    body = await read_body(request, commitline.settings.http_max_body_bytes)
    subject = subject_of(body, commitline.settings.command_limits())
    try:
        done = await run_in_threadpool(commitline.erase, key.tenant, subject, by=f"api key {key.key_id}")
    except RebuildRunning as e:  # waited for the rebuild in the way (ERASURE_REBUILD_WAIT_S): no defect to trace
        log.warning("erasure of a subject of tenant %s: recomputing the read models waited too long: %s", key.tenant,
                    e)
        raise ErasureIncomplete(subject, sorted(commitline.domain.personal_projections)) from None
    except RebuildError:
        log.exception("erasure of a subject of tenant %s: recomputing the read models failed", key.tenant)
        raise ErasureIncomplete(subject, sorted(commitline.domain.personal_projections)) from None
    return _json({"tenant": key.tenant, "subject": subject, "erased": [_view(e) for e in done],
                  "rebuilt": [r.projection for r in done.rebuilt]})


@router.get(
    "/v1/erasures",
    summary="The key's tenant's erasures, oldest first (administrative API keys only)",
    responses={200: {"model": ErasuresOut, "description": "every erasure of the tenant (of `subject`, if given)"},
               **_FORBIDDEN},
)
def get_erasures(request: Request, key: Any = Depends(admin_key),
                 subject: str | None = Query(None, min_length=1, pattern=SUBJECT_PATTERN,
                                             description="only this data subject's")) -> Response:
    commitline = request.app.state.commitline
    limit = commitline.settings.max_string_length  # as POST bounds it: any subject it erases can be looked up
    if subject is not None and len(subject) > limit:
        raise InvalidQuery([{"loc": ["query", "subject"], "msg": f"String should have at most {limit} characters",
                             "type": "string_too_long"}])
    done = commitline.erasures(key.tenant)
    return _json({"tenant": key.tenant,
                  "erasures": [_view(e) for e in done if subject is None or e.subject == subject]})
