"""The ASGI application: its routers, every error as a problem document, and the OpenAPI description.

``create_app(commitline)`` serves one bootstrapped ``Commitline`` (the caller closes it) and its domain:
the commands it accepts (each with its JSON schema in ``/openapi.json``), the domain's error codes beside
commitline's, and its read-model queries. ``app_from_environment()`` is the factory each ``commitline
serve --workers N`` worker process calls: it loads the domain (``COMMITLINE_APP``) and bootstraps from the
environment when the worker starts, and closes on shutdown.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from commitline.application.boundary import at_most
from commitline.application.errors import CommitlineError, StoreUnavailable
from commitline.composition import Commitline, Domain, bootstrap, load_domain, load_settings
from commitline.composition import logs
from commitline.composition.observability import tracing_from_environment
from commitline.composition.orphans import end_with_parent
from commitline.http import commands, docs, erasures, openapi, operations, queries, reads, status_page, tracing
from commitline.http.access_log import without_keys
from commitline.http.parameters import documented_query_only
from commitline.http.operations import SENT_METHOD, note_readiness
from commitline.http.problems import (
    InternalError,
    InvalidQuery,
    MethodNotAllowed,
    RouteNotFound,
    problem_response,
)

log = logging.getLogger(__name__)
#: A worker that cannot use PostgreSQL as it starts ends with this code after this pause, and serve starts
#: another: not uvicorn's STARTUP_FAILURE (3), after which serve would stop every worker.
WORKER_RESTARTED = 75
WORKER_RESTART_PAUSE_S = 2.0
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

def _instance(request: Request) -> str:
    """The request's path as a problem names it: a key pasted into it is not sent back (nor logged)."""
    return without_keys(request.url.path)


def install_problem_handlers(app: FastAPI) -> None:
    async def typed(request: Request, error: Exception) -> Response:
        assert isinstance(error, CommitlineError)
        return problem_response(error, _instance(request))

    async def invalid_parameters(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        errors = [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type", "")}
                  for e in error.errors()]
        return problem_response(InvalidQuery(at_most(errors)), _instance(request))

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        if error.status_code == 405:
            return problem_response(MethodNotAllowed(request.method, request.url.path), _instance(request),
                                    allowed(_methods_at(request, error.headers)))
        return problem_response(RouteNotFound(request.url.path), _instance(request))

    async def unexpected(request: Request, error: Exception) -> Response:
        log.error("unexpected error on %s %s", request.method, _instance(request), exc_info=error)
        return problem_response(InternalError(request.method, request.url.path), _instance(request))

    app.add_exception_handler(CommitlineError, typed)
    app.add_exception_handler(RequestValidationError, invalid_parameters)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


def _openapi(app: FastAPI, domain: Domain) -> dict[str, Any]:
    if app.openapi_schema is None:
        served = app.state.commitline
        settings = served.settings if served is not None else load_settings()
        app.openapi_schema = openapi.describe(app, domain, settings.command_limits())
    return app.openapi_schema


class HeadAsGet:
    """ASGI middleware: HEAD is answered as GET wherever GET is (RFC 9110), the server sending no body; and a
    405 names HEAD beside GET in its ``Allow`` header."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET", SENT_METHOD: "HEAD"}  # the metrics count it as sent
        await self.app(scope, receive, send)


def _methods_at(request: Request, headers: Mapping[str, str] | None) -> dict[str, str]:
    """A 405's headers with ``Allow`` naming every method of the path: the router names only the methods of the
    first route that matched it (``/v1/erasures`` has one route for GET, another for POST), so those the
    description gives for the path are added."""
    out = dict(headers or {})
    methods = {m.strip() for m in out.get("Allow", "").split(",") if m.strip()}
    path = request.scope["path"]
    for template, by_method in request.app.openapi()["paths"].items():
        pattern = "".join("[^/]+" if part.startswith("{") else re.escape(part)
                          for part in re.split(r"(\{[^/}]+\})", template))
        if re.fullmatch(pattern, path):
            methods |= {m.upper() for m in by_method if m.upper() in _METHODS}
    if methods:
        out["Allow"] = ", ".join(sorted(methods))
    return out


def allowed(headers: Mapping[str, str] | None) -> dict[str, str]:
    """A 405's headers with HEAD listed wherever GET is."""
    out = dict(headers or {})
    methods = [m.strip() for m in out.get("Allow", "").split(",") if m.strip()]
    if "GET" in methods and "HEAD" not in methods:
        methods.append("HEAD")
    if methods:
        out["Allow"] = ", ".join(sorted(methods))
    return out


def create_app(commitline: Commitline | None, *, domain: Domain | None = None, lifespan: Any = None,
               operator_views: bool = True) -> FastAPI:
    """The API of ``commitline`` (or, for a worker that bootstraps in ``lifespan``, of ``domain``); without
    ``operator_views`` (the status page, ``/v1/status``, ``/metrics``: ``operators.py`` serves them apart)."""
    domain = domain if domain is not None else commitline.domain  # type: ignore[union-attr]
    app = FastAPI(
        title="commitline",
        version="1",
        description=f"The domain {domain.name!r}: event-sourced commands, exactly once: POST /v1/commands with an "
        "Idempotency-Key and Authorization: Bearer <api key>. Errors are RFC 9457 problem documents.",
        lifespan=lifespan,
        docs_url=None,  # served by docs.py from installed assets, not FastAPI's CDN-backed pages
        redoc_url=None,
        redirect_slashes=False,  # "/v1/commands/" is not found, not redirected (before authentication) elsewhere
        # commitline traces (tracing.py) and counts (operations.py) requests itself: FastAPI's own telemetry
        # would only look up the global OpenTelemetry providers on every request
        telemetry={"tracing": False, "metrics": False, "logs": False},
        dependencies=[Depends(documented_query_only)],
    )
    app.state.commitline = commitline
    app.state.domain = domain
    install_problem_handlers(app)
    routers = [commands.router, reads.router, erasures.router, operations.router, docs.router]
    if operator_views:
        routers += [operations.metrics_router, status_page.router]
    for router in routers:
        app.include_router(router)
    app.include_router(queries.router_for(domain))
    app.add_middleware(commands.CommandEndpoint, route=commands.declared_route())  # inside metrics and tracing
    traced = commitline.tracing if commitline is not None else tracing_from_environment()
    operations.instrument(app, name_spans=traced is not None)  # every request counted and timed in /metrics
    tracing.instrument(app, traced)  # outside the metrics' middleware, whose requests it traces
    app.add_middleware(HeadAsGet)
    app.openapi = lambda: _openapi(app, domain)  # type: ignore[method-assign]
    return app


def freeze_startup_heap() -> None:
    """Move everything a serving process made to start (the domain, the routes and their models, the store and
    its pools) out of the collector's reach (``gc.freeze``), garbage collected first so none of it is kept.

    Requests in flight hold their objects across many young collections, so some reach the oldest generation
    and a full collection follows every few thousand requests. Each one scanned every object of the process,
    about 75 ms with the interpreter lock held (measured under ``make bench``'s HTTP load: one every half
    second, finding nothing to free), and every request in flight waited for it: the HTTP p99. With the
    start-up objects frozen a full collection takes about 3 ms. The follower engine does the same
    (``Follower.run``)."""
    gc.collect()
    gc.freeze()


def app_from_environment() -> FastAPI:
    """One worker's app: its domain loaded now (its routes depend on it), bootstrapped from the environment when
    the worker starts, closed when it stops. The worker stops (SIGTERM, gracefully) when the supervisor that
    started it dies: killed with -9, it must not leave workers serving on its port."""
    parent = multiprocessing.parent_process()  # serve's supervisor, which started this worker
    if parent is not None and parent.pid is not None and not end_with_parent(signal.SIGTERM, parent.pid):
        raise SystemExit("serve's supervisor is gone: this worker does not start")  # it died as this one started
    logs.configure(logs.chosen_level("INFO"))  # a spawned worker inherits none of serve's logging
    holder: dict[str, Commitline] = {}
    settings = load_settings()
    domain = load_domain(settings.app)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            holder["app"] = app.state.commitline = bootstrap(domain=domain, apply_migrations=False,
                                                             dispatch_cpu="auto")
        except StoreUnavailable as e:
            # A failed start is uvicorn's sign of a broken app, and it would stop serve and every other worker
            # with it; PostgreSQL away is no such thing: this worker ends otherwise, and serve starts another.
            log.error("this worker cannot use PostgreSQL as it starts (%s): it ends, and serve starts another in "
                      "%.0f s; the other workers go on", e.reason, WORKER_RESTART_PAUSE_S)
            time.sleep(WORKER_RESTART_PAUSE_S)  # a restart every few seconds, not a storm, while the outage lasts
            logging.shutdown()
            os._exit(WORKER_RESTARTED)
        holder["app"].dispatch_cpu.enter()  # the event loop too, and the threads it starts: the whole worker
        note_readiness(app.state, holder["app"].unready())
        freeze_startup_heap()
        try:
            yield
        finally:
            holder["app"].close()

    # serve sets the operators' port in the environment when it has one: its supervisor answers them there
    return create_app(None, domain=domain, lifespan=lifespan,
                      operator_views=settings.http_operator_port is None)
