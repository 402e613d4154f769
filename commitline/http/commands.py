"""``POST /v1/commands``: one command per request, exactly once per ``Idempotency-Key``.

The checks run in this order, each answering with its problem document before anything is written:
the API key (401), the media type (415), the body's size (413, unread), the ``Idempotency-Key``
header (400 missing or unusable), the JSON (400 malformed), then ``dispatch`` and its typed errors.

The body of a success is the dispatch result without ``replayed`` (the stored outcome), so a replay of the
key answers with the first response's status, ``Location`` and body, byte for byte, marked by
``Idempotent-Replayed: true``. A command that created its aggregate answers 201 with the aggregate's
``Location``, any other 200. A refused command wrote nothing and recorded nothing, so the same key may be
used again (after fixing the request, or once the state allows it); the same key with a different
command after a success is refused with ``idempotency_key_reused`` (422).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from starlette.concurrency import run_in_threadpool

from commitline.application.boundary import KEY_WHITE_SPACE, check_idempotency_key
from commitline.application.errors import MissingIdempotencyKey
from commitline.application.results import DispatchResult
from commitline.http.auth import tenant
from commitline.http.problems import (
    PROBLEM_JSON,
    BodyTooLarge,
    DuplicateHeader,
    MalformedJson,
    UnsupportedMediaType,
)

router = APIRouter()
KEY_HEADER = "idempotency-key"
REPLAYED_HEADERS = {"Idempotent-Replayed": "true", "X-Idempotent-Replayed": "true"}
_REQUEST = "POST /v1/commands"


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def idempotency_key(request: Request) -> str:
    """The header's key: a plain token, or a quoted string as the Idempotency-Key draft writes it; refused when
    sent twice (which one counts would be a guess). ``check_idempotency_key`` then drops surrounding white
    space and refuses anything but printable ASCII, exactly as for Python and the CLI."""
    sent = request.headers.getlist(KEY_HEADER)
    if len(sent) > 1:
        raise DuplicateHeader("Idempotency-Key", len(sent))
    raw = sent[0] if sent else None
    if raw is None:
        raise MissingIdempotencyKey(_REQUEST, "send an Idempotency-Key header (1-255 printable ASCII characters, "
                                    "one per command; a retry sends the same key)")
    raw = raw.strip(KEY_WHITE_SPACE)
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        raw = raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return check_idempotency_key(raw, _REQUEST)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read only while it stays within ``limit`` bytes (BodyTooLarge otherwise)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def utf8_only(body: bytes) -> None:
    """A body that is not UTF-8 is not JSON at all: a malformed request (400), like any other unreadable JSON."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedJson([{"loc": [], "msg": f"not valid UTF-8: byte 0x{body[e.start]:02x} at position {e.start}",
                              "type": "json_invalid_utf8"}]) from None


def created(result: DispatchResult) -> bool:
    return bool(result.events) and result.events[0].version == 1


def result_response(result: DispatchResult) -> Response:
    headers = dict(REPLAYED_HEADERS) if result.replayed else {}
    status = 200
    if created(result):
        status, headers["Location"] = 201, f"/v1/aggregates/{result.aggregate_id}"
    return Response(result.outcome_bytes(), status_code=status, headers=headers, media_type="application/json")


_PROBLEM = {"content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


@router.post(
    "/v1/commands",
    summary="Dispatch one command, exactly once per Idempotency-Key",
    responses={
        200: {"description": "applied to an existing aggregate (or replayed)"},
        201: {"description": "created an aggregate; Location names it"},
        **{code: {"description": text, **_PROBLEM} for code, text in (
            (400, "missing or unusable Idempotency-Key, or malformed JSON"), (401, "missing or unknown API key"),
            (404, "no such aggregate for this tenant"), (409, "version conflict or a refusal by the aggregate's state"),
            (413, "body or event too large"), (415, "not JSON"), (422, "invalid command, or key reused"),
            (503, "store unavailable: retry with the same key"))},
    },
    openapi_extra={
        "parameters": [{"name": "Idempotency-Key", "in": "header", "required": True,
                        "schema": {"type": "string", "maxLength": 255}}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
    },
)
async def post_command(request: Request, caller: str = Depends(tenant)) -> Response:
    commitline = request.app.state.commitline
    if not is_json(request.headers.get("content-type")):
        raise UnsupportedMediaType(request.headers.get("content-type"))
    body = await read_body(request, commitline.settings.http_max_body_bytes)
    key = idempotency_key(request)
    utf8_only(body)
    result = await run_in_threadpool(commitline.dispatch, body, idempotency_key=key, tenant=caller)
    return result_response(result)
