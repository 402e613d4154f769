"""Operations endpoints: liveness (``/healthz``), readiness (``/readyz``) and Prometheus ``/metrics``
(``metrics_router``: served with the status page, on the operators' port when ``serve`` has one), and the
middleware that counts and times every HTTP request (``instrument``).

They are for operators and orchestrators and need no API key: ``/healthz`` never touches the database,
``/readyz`` asks it whether this process can serve (``Commitline.unready()``), ``/metrics`` renders every
worker's metrics and reads follower positions from PostgreSQL at scrape time (``Commitline.metrics_text()``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from commitline.application.errors import joined
from commitline.composition.observability import observe_request
from commitline.composition.operations import UNREACHABLE
from commitline.http.problems import PROBLEM_JSON, HttpProblem, problem_response

log = logging.getLogger(__name__)
router = APIRouter(tags=["operations"])
metrics_router = APIRouter(tags=["operations"])  # an operators' view: on the operators' port when it has one
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # the route label of a request no route answered (404): never its path
READY_RETRY_AFTER_S = "5"
#: The scope key holding a request's method as sent, where the app answers it as another (HEAD as GET).
SENT_METHOD = "commitline.sent_method"


class NotReady(HttpProblem):
    code = "not_ready"
    fields = ("reasons",)
    message = "not ready: {summary}"
    summary = joined("reasons")


@router.get("/healthz", summary="Liveness: the process runs (no database access)", responses={200: {"content": {
    "application/json": {"schema": {"type": "object", "properties": {"status": {"type": "string", "enum": ["alive"]}},
                                    "required": ["status"]}}}}})
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get(
    "/readyz",
    summary="Readiness: the database answers, its schema has every migration this commitline needs (a newer one "
            "too: migrations only add), and a master key opens the personal fields",
    responses={200: {"content": {"application/json": {"schema": {
                  "type": "object", "properties": {"status": {"type": "string", "enum": ["ready"]}},
                  "required": ["status"]}}}},
               503: {"description": "not ready; `reasons` says why (codes: not_ready, store_unavailable)",
                     "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}},
)
def readyz(request: Request) -> Response:
    reasons = request.app.state.commitline.unready()
    note_readiness(request.app.state, reasons)  # the log has every reason whole
    if reasons:
        told = [f"{UNREACHABLE} (the server's log names the cause)" if r.startswith(UNREACHABLE) else r
                for r in reasons]
        return problem_response(NotReady(told), request.url.path, {"Retry-After": READY_RETRY_AFTER_S})
    return JSONResponse({"status": "ready"})


def note_readiness(state: Any, reasons: list[str]) -> None:
    """Log why this process is not ready when that starts or changes, and that it is ready again when it is: the
    reason is then in its log, not only in a ``/readyz`` answer (which a probe like ``curl -sf`` does not show)."""
    was = getattr(state, "unready_reasons", None)
    if reasons and reasons != was:
        log.warning("not ready: %s", "; ".join(reasons))
    elif not reasons and was:
        log.info("ready again")
    state.unready_reasons = reasons


@metrics_router.get(
    "/metrics",
    summary="Prometheus metrics (text format): commands, latency, retries, conflicts, follower positions and lag",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
def metrics(request: Request) -> Response:
    return Response(request.app.state.commitline.metrics_text(), media_type=CONTENT_TYPE_LATEST)


class RequestMetrics:
    """ASGI middleware: each HTTP request counted and timed by method, route template and status; with
    ``name_spans`` (tracing on: it runs inside the request's span) that span named after the route that answered
    (``GET /v1/aggregates/{aggregate_id}``), with ``http.route``: a name per route, not one per id."""

    def __init__(self, app: ASGIApp, name_spans: bool = False):
        self.app = app
        self.name_spans = name_spans

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        sent = scope.get(SENT_METHOD, scope["method"])  # as sent: a HEAD is answered as a GET (``app.HeadAsGet``)
        method = sent if sent in _METHODS else "other"
        status = 500  # unless the app starts a response

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if self.name_spans:  # the route is known now, and the span still open (it ends with the answer)
                    name_span(f"{scope['method']} {route_of(scope)}", route_of(scope))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            observe_request(method, route_of(scope), status, time.perf_counter() - started)


def name_span(name: str, route: str) -> None:
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.update_name(name)
        span.set_attribute("http.route", route)


def route_of(scope: dict[str, Any]) -> str:
    """The template of the route that answered (``UNMATCHED`` when none did)."""
    route = scope.get("route")  # set by the router on the shared scope once one of the API's routes matched
    path = getattr(route, "path", None)
    if path is None and "endpoint" in scope:  # a plain route of the framework's own (``/openapi.json``)
        path = next((r.path for r in getattr(scope.get("app"), "routes", ())
                     if getattr(r, "endpoint", None) is scope["endpoint"]), None)
    return path or UNMATCHED


def instrument(app: FastAPI, name_spans: bool = False) -> None:
    app.add_middleware(RequestMetrics, name_spans=name_spans)
