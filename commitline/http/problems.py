"""Errors as RFC 9457 problem documents: the one table from error code to HTTP status, and the rendering.

A problem document carries the standard members (``type``, ``title``, ``status``, ``detail``,
``instance``) and the typed error's ``code``, ``error`` (its class) and ``details``, exactly as the CLI
prints them; each detail is also a member of the problem itself (``actual_version``, ``errors``, ...)
unless it would shadow a standard member. ``STATUS`` is commitline's own table; a domain's errors declare
their status themselves (``DomainError.status``); ``status_markdown(domain)`` is the table the errors reference
reproduces, both together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import orjson
from starlette.responses import Response

from commitline.application.errors import (CommitlineError, ConfigurationError, InvalidCommand, StoreUnavailable,
                                           at_location, joined)
from commitline.http.access_log import without_keys

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "urn:commitline:problem:"
_STANDARD = frozenset({"type", "title", "status", "detail", "instance"})
#: ``Retry-After`` of a 503 for a setting that is missing or wrong: it takes an operator (a store that is
#: unavailable, and every other 503, says 1)
CONFIGURATION_RETRY_AFTER_S = "30"

#: commitline's error codes -> HTTP status; a domain error has its own ``status``; any other code is a
#: refusal of the request as sent (422).
STATUS: dict[str, int] = {
    # the request itself
    "malformed_json": 400,
    "duplicate_header": 400,
    "missing_idempotency_key": 400,
    "invalid_idempotency_key": 400,
    "invalid_query": 400,
    "invalid_tenant": 400,
    "unauthorized": 401,
    "admin_key_required": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "body_too_large": 413,
    "event_too_large": 413,
    "unsupported_media_type": 415,
    "invalid_command": 422,
    "unknown_command_type": 422,
    "idempotency_key_reused": 422,
    "event_not_storable": 422,
    "invalid_value": 422,
    "invalid_body": 422,
    # the state the command met
    "aggregate_not_found": 404,
    "version_beyond_head": 404,
    "before_creation": 404,
    "concurrency_conflict": 409,
    "illegal_transition": 409,
    "aggregate_already_exists": 409,
    "wrong_aggregate_type": 409,
    "audit_query_error": 400,
    # the service
    "store_unavailable": 503,
    "closed": 503,
    "erasure_incomplete": 503,
    "not_ready": 503,
    "configuration_error": 503,
    "wrong_master_key": 503,
    "invalid_app": 503,
    "invalid_domain": 503,
    "internal_error": 500,
    "history_broken": 500,
}
DEFAULT_STATUS = 422


class HttpProblem(CommitlineError):
    """A problem with the HTTP request rather than the command (its ``code`` is in ``STATUS``)."""

    fields = ("reason",)
    message = "{reason}"


class Unauthorized(HttpProblem):
    """No API key, or one that is unknown or revoked (401, with ``WWW-Authenticate``)."""

    code = "unauthorized"


class AdminKeyRequired(HttpProblem):
    """An ordinary API key on a route reserved for its tenant's administrative keys."""

    code = "admin_key_required"
    fields = ("tenant", "key_id")
    message = ("API key {key_id} of tenant {tenant} is not an administrative key: erasing data subjects and listing "
               "erasures need one (commitline tenants add {tenant} --admin)")


class ErasureIncomplete(HttpProblem):
    """A data key was deleted (or already was), but recomputing the read models that may hold the subject's
    values failed: the same request again runs that recomputation again."""

    code = "erasure_incomplete"
    fields = ("subject", "read_models")
    message = ("the erasure of subject {subject} is recorded, but recomputing the read models that may still show "
               "its values ({shown}) failed: send the same request again to finish it")
    shown = joined("read_models", separator=", ")


class InvalidBody(HttpProblem):
    """A JSON body that is not what the route takes (for a command, ``invalid_command`` says so instead)."""

    code = "invalid_body"
    fields = ("errors",)
    message = "invalid request body: {summary}"
    summary = joined("errors", at_location("<body>"))


class BodyTooLarge(HttpProblem):
    """The request body is above ``COMMITLINE_HTTP_MAX_BODY_BYTES``; it was not read."""

    code = "body_too_large"
    fields = ("limit",)
    message = "the request body is larger than {limit} bytes (COMMITLINE_HTTP_MAX_BODY_BYTES)"


class UnsupportedMediaType(HttpProblem):
    """A body that is not declared as JSON."""

    code = "unsupported_media_type"
    fields = ("content_type",)
    message = "the body must be JSON in UTF-8 (Content-Type: application/json), not {shown}"
    shown = property(lambda error: repr(error.content_type) if error.content_type else "a body without a Content-Type")


class UnsupportedContentEncoding(UnsupportedMediaType):
    """A body sent under a content coding (``Content-Encoding: gzip``...): read as it is, it would be refused
    as malformed JSON, which would not say why."""

    fields = ("content_type", "content_encoding")
    message = ("the body must be sent as it is (no Content-Encoding), not under {content_encoding!r}: send plain JSON "
               "in UTF-8")


class MalformedJson(HttpProblem):
    """A body that is not JSON (or not UTF-8), with where it stops being so."""

    code = "malformed_json"
    fields = ("errors",)
    message = "the body is {summary}"
    summary = joined("errors", lambda problem: problem["msg"])


class DuplicateHeader(HttpProblem):
    """A header that must be sent once came several times: which one counts would be a guess."""

    code = "duplicate_header"
    fields = ("header", "count")
    message = "the {header} header was sent {count} times: send it once"


class InvalidQuery(HttpProblem):
    """A path or query parameter that is not of its type or range."""

    code = "invalid_query"
    fields = ("errors",)
    message = "invalid query or path parameters: {summary}"
    summary = joined("errors", at_location())


class RouteNotFound(HttpProblem):
    """No route at that path (shown without a key pasted into it)."""

    code = "not_found"
    fields = ("path",)
    message = "no resource at {path}"

    def __init__(self, path: str):
        super().__init__(without_keys(path))


class MethodNotAllowed(HttpProblem):
    """The path exists, not for that method (405, with ``Allow``)."""

    code = "method_not_allowed"
    fields = ("method", "path")
    message = "{method} is not allowed on {path}"

    def __init__(self, method: str, path: str):
        super().__init__(method, without_keys(path))


class InternalError(HttpProblem):
    """An unexpected fault. A command's wrote nothing, and a retry with the same key answers either way; a read
    changes nothing, so it may simply be sent again."""

    code = "internal_error"
    fields = ()
    message = "internal error; nothing was written (retry with the same Idempotency-Key to be sure)"
    READ = "internal error; a read changes nothing, so it may be sent again (the server's log has the cause)"
    OTHER = "internal error; the server's log has the cause"

    def __init__(self, method: str = "POST", path: str = "/v1/commands") -> None:
        CommitlineError.__init__(self, self.READ if method in ("GET", "HEAD") else self.message
                                 if path.rstrip("/") == "/v1/commands" else self.OTHER)


#: What a caller is told when PostgreSQL cannot be used: where it is and as whom stays in the server's log
STORE_UNAVAILABLE_TO_CALLERS = ("PostgreSQL could not be reached or used; retry with the same key (the server's log "
                                "names the cause)")


class OncePerCause:
    """Logs a cause of failure when it first comes, or comes back after ``quiet_s``: once per outage, not once per
    request that meets it."""

    def __init__(self, quiet_s: float = 60.0):
        self.quiet_s = quiet_s
        self._last: tuple[str, float] | None = None

    def note(self, cause: str) -> None:
        now = time.monotonic()
        if self._last is None or self._last[0] != cause or now - self._last[1] > self.quiet_s:
            log.warning("answering 503 store_unavailable: %s", cause)
            self._last = (cause, now)


_outage_told = OncePerCause()


def as_http_error(error: CommitlineError) -> CommitlineError:
    """A command that is not JSON at all is a malformed request (400), not an invalid command (422); a store that
    cannot be used is told without the database's address and user (logged instead)."""
    if isinstance(error, InvalidCommand) and error.not_json:
        return MalformedJson(error.errors)
    if isinstance(error, StoreUnavailable) and error.reason != STORE_UNAVAILABLE_TO_CALLERS:
        _outage_told.note(error.reason)
        return StoreUnavailable(STORE_UNAVAILABLE_TO_CALLERS)
    return error


def status_of(error: CommitlineError) -> int:
    status = STATUS.get(error.code) or getattr(error, "status", None)
    return status if isinstance(status, int) and 400 <= status <= 599 else DEFAULT_STATUS


def statuses(domain_statuses: Mapping[str, int] | None = None) -> dict[str, int]:
    """Every error code with its HTTP status: commitline's, then the domain's."""
    return {**STATUS, **(domain_statuses or {})}


def problem_document(error: CommitlineError, instance: str) -> dict[str, Any]:
    status = status_of(error)
    details = error.details()
    document: dict[str, Any] = {
        "type": TYPE_PREFIX + error.code,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": str(error),
        "instance": instance,
    }
    document.update({k: v for k, v in details.items() if k not in _STANDARD})
    document.update({"code": error.code, "error": type(error).__name__, "details": details})
    return document


def problem_response(error: CommitlineError, instance: str, headers: dict[str, str] | None = None) -> Response:
    error = as_http_error(error)
    extra = dict(headers or {})
    if isinstance(error, Unauthorized):
        extra["WWW-Authenticate"] = 'Bearer realm="commitline"'
    if status_of(error) == 503:  # every 503 says when to try again; a configuration waits for an operator
        extra.setdefault("Retry-After", CONFIGURATION_RETRY_AFTER_S if isinstance(error, ConfigurationError) else "1")
    body = orjson.dumps(problem_document(error, instance), default=str)
    return Response(body, status_code=status_of(error), headers=extra, media_type=PROBLEM_JSON)


def status_markdown(domain_statuses: Mapping[str, int] | None = None) -> str:
    """The errors reference's table of error codes by HTTP status: commitline's (``STATUS``) and a domain's."""
    by_status: dict[int, list[str]] = {}
    for code, status in statuses(domain_statuses).items():
        by_status.setdefault(status, []).append(code)
    rows = ["| HTTP status | error `code` |", "|---|---|"]
    rows += [f"| {status} {HTTPStatus(status).phrase} | {', '.join(f'`{c}`' for c in codes)} |"
             for status, codes in sorted(by_status.items())]
    rows.append(f"| {DEFAULT_STATUS} {HTTPStatus(DEFAULT_STATUS).phrase} | any other code (a refusal of the request "
                "as sent) |")
    return "\n".join(rows)


if __name__ == "__main__":
    from commitline.composition import load_domain

    print(status_markdown(load_domain().error_statuses))
