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

The route is the API's hot path, so ``CommandEndpoint`` answers it straight from ASGI (inside the request's
metrics and trace span, before FastAPI's routing and dependency solving; the route below is its
description): the headers are read once, the body goes to ``dispatch`` as received (parsed and validated
once, by the command boundary), the blocking part (the API key's one-statement read, then ``dispatch``) takes
one trip to a worker thread, and the result's stored outcome is the body as it is, serialised once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from commitline.application.boundary import KEY_WHITE_SPACE, check_idempotency_key
from commitline.application.errors import CommitlineError, InvalidIdempotencyKey, MissingIdempotencyKey, printable
from commitline.application.results import DispatchResult
from commitline.http.access_log import without_keys
from commitline.http.auth import presented_in, resolved
from commitline.http.parameters import refused_query
from commitline.http.problems import (
    PROBLEM_JSON,
    BodyTooLarge,
    DuplicateHeader,
    InternalError,
    MalformedJson,
    UnsupportedContentEncoding,
    UnsupportedMediaType,
    problem_response,
)
from commitline.http.threads import BlockingCalls

log = logging.getLogger(__name__)
router = APIRouter()
PATH = "/v1/commands"
KEY_HEADER = "idempotency-key"
REPLAYED_HEADERS = {"Idempotent-Replayed": "true", "X-Idempotent-Replayed": "true"}
_REPLAYED_RAW = [(b"idempotent-replayed", b"true"), (b"x-idempotent-replayed", b"true")]
_JSON_RAW = (b"content-type", b"application/json")
_REQUEST = "POST /v1/commands"
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)  # an RFC 9110 quoted-string: every " or \ inside escaped
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)  # a quoted pair: \" and \\ stand for " and \ (others are kept as sent)
#: Threads running the blocking part of a command (the key's read and ``dispatch``): as many as Starlette's
#: default thread pool has for a route's blocking work.
THREADS = 40


def is_json(content_type: str | None) -> bool:
    """JSON, as ``application/json`` or ``application/<anything>+json``, in UTF-8: a ``charset`` parameter naming
    anything else is refused here (415) rather than read as UTF-8 and refused as malformed."""
    media, _, parameters = (content_type or "").partition(";")
    media = media.strip().lower()
    if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
        return False
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


def media_type(headers: Headers) -> None:
    """Refuse a body that is not JSON in UTF-8 (415), sent under a content coding (415: gzip and the like are not
    read), or whose Content-Type came several times (which one counts would be a guess)."""
    sent = headers.getlist("content-type")
    if len(sent) > 1:
        raise DuplicateHeader("Content-Type", len(sent))
    if not is_json(sent[0] if sent else None):
        raise UnsupportedMediaType(sent[0] if sent else None)
    codings = [c.strip() for value in headers.getlist("content-encoding") for c in value.split(",") if c.strip()]
    if any(c.lower() != "identity" for c in codings):
        raise UnsupportedContentEncoding(sent[0], without_keys(printable(", ".join(codings), 64)))


def _as_sent(value: str) -> str:
    """A header value as its sender wrote it: the server reads header bytes as Latin-1, so a UTF-8 key's 'é'
    arrives as 'Ã©'; read back as UTF-8 when it is that, so a refusal names the character the client sent."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:  # not UTF-8: the bytes as Latin-1 are as good a reading as any
        return value


def idempotency_key(headers: Headers) -> str:
    """The header's key: a plain token, or a quoted string as the Idempotency-Key draft writes it; refused when
    sent twice (which one counts would be a guess). ``check_idempotency_key`` then drops surrounding white
    space and refuses anything but printable ASCII, exactly as for Python and the CLI."""
    sent = headers.getlist(KEY_HEADER)
    if len(sent) > 1:
        raise DuplicateHeader("Idempotency-Key", len(sent))
    raw = sent[0] if sent else None
    if raw is None:
        raise MissingIdempotencyKey(_REQUEST, "send an Idempotency-Key header (1-255 printable ASCII characters, "
                                    "one per command; a retry sends the same key)")
    raw = _as_sent(raw).strip(KEY_WHITE_SPACE)
    if raw[:1] == raw[-1:] == '"':  # a lone '"' too: it begins and ends with one
        if not _QUOTED.fullmatch(raw):  # "x"y" is neither x"y nor "x"y": two clients could mean either
            raise InvalidIdempotencyKey(_REQUEST, 'the idempotency key begins and ends with \'"\' but is not one '
                                        'quoted string: escape a quote or backslash inside it with \\, or send the '
                                        "key unquoted")
        raw = _ESCAPED.sub(lambda m: m.group(1) if m.group(1) in '"\\' else m.group(0), raw[1:-1])
    return check_idempotency_key(raw, _REQUEST)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read only while it stays within ``limit`` bytes (BodyTooLarge otherwise)."""
    return await received_body(request.headers, request.receive, limit)


async def received_body(headers: Headers, receive: Receive, limit: int) -> bytes:
    """The body of the request ``receive`` delivers, read only while it stays within ``limit`` bytes
    (BodyTooLarge otherwise; ClientGone when the client left before sending it all)."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class ClientGone(Exception):
    """The client disconnected before its request's body was read: there is no one to answer."""


def utf8_only(body: bytes) -> None:
    """A body that is not UTF-8 is not JSON at all: a malformed request (400), like any other unreadable JSON."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedJson([{"loc": [], "msg": f"not valid UTF-8: byte 0x{body[e.start]:02x} at position {e.start}",
                              "type": "json_invalid_utf8"}]) from None


def created(result: DispatchResult) -> bool:
    return bool(result.events) and result.events[0].version == 1


def answer(result: DispatchResult) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The status, headers and body of a dispatch result: its stored outcome, serialised once."""
    body = result.outcome_bytes()
    headers = [_JSON_RAW, (b"content-length", str(len(body)).encode())]
    if result.replayed:
        headers += _REPLAYED_RAW
    if created(result):
        headers.append((b"location", f"/v1/aggregates/{result.aggregate_id}".encode()))
        return 201, headers, body
    return 200, headers, body


_PROBLEM = {"content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


@router.post(
    PATH,
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
async def post_command(request: Request) -> Response:
    # The route as FastAPI sees it, for /openapi.json (a docstring here would become its description): in the
    # application ``CommandEndpoint`` answers it first, the same way.
    status, headers, body = await command(request.app.state.commitline, request.headers, request.receive,
                                          _threads(request.app.state))
    response = Response(body, status_code=status)
    response.raw_headers = headers
    return response


def declared_route() -> Any:
    """The route ``POST /v1/commands`` as declared here."""
    (route,) = [r for r in router.routes if getattr(r, "path", None) == PATH and "POST" in getattr(r, "methods", ())]
    return route


async def command(commitline: Any, headers: Headers, receive: Receive, threads: Callable[..., Any],
                  query: bytes = b"") -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One command request, checked in the documented order, its blocking part (the API key's read and
    ``dispatch``) in one call of ``threads``; CommitlineError for a refusal."""
    api_key = presented_in(headers)
    try:
        if query:  # the route takes none: a parameter here would be ignored, as if not sent
            refusal = refused_query([name for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True)])
            if refusal is not None:
                raise refusal
        media_type(headers)
        body = await received_body(headers, receive, commitline.settings.http_max_body_bytes)
        key = idempotency_key(headers)
        utf8_only(body)
    except CommitlineError:
        await threads(resolved, commitline, api_key)  # an unknown key is told first (401)
        raise
    return answer(await threads(authorised_dispatch, commitline, api_key, body, key))


def authorised_dispatch(commitline: Any, api_key: str, body: bytes, key: str) -> DispatchResult:
    """The key resolved and the command dispatched (the raw body: parsed and validated once, by the command
    boundary), both blocking, in one trip to a worker thread."""
    return commitline.dispatch(body, idempotency_key=key, tenant=resolved(commitline, api_key).tenant)


def _threads(state: Any) -> Callable[..., Any]:
    """``state``'s runner of blocking calls (``threads.py``): made on first use (in the worker process, by its
    event loop's thread, so its threads run where that thread may), each call in a copy of the caller's
    context (the request's trace span is the parent of the command's)."""
    run = getattr(state, "command_threads", None)
    if run is None:
        run = state.command_threads = BlockingCalls(THREADS, "commitline-http")
    return run  # type: ignore[no-any-return]


class CommandEndpoint:
    """ASGI middleware answering ``POST /v1/commands`` itself, inside the request's metrics and trace span
    and before FastAPI's routing, request objects and dependency solving (the route is still declared, for
    its description): the headers read once, the body passed as received to ``dispatch``, the result's
    stored outcome sent as the body. Anything else goes on to the application."""

    def __init__(self, app: ASGIApp, route: Any = None):
        self.app = app
        self.route = route  # the declared route: the request's metrics and span are labelled with its path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        fastapi_app = scope["app"]
        if self.route is not None:
            scope["route"] = self.route
        try:
            status, headers, body = await command(fastapi_app.state.commitline, Headers(scope=scope), receive,
                                                  _threads(fastapi_app.state), scope.get("query_string", b""))
        except ClientGone:
            return
        except CommitlineError as error:
            await problem_response(error, Request(scope).url.path)(scope, receive, send)
            return
        except Exception as error:
            log.error("unexpected error on POST %s", PATH, exc_info=error)
            await problem_response(InternalError(), Request(scope).url.path)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
