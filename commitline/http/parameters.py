"""Query parameters a ``/v1`` read does not take are refused (400 ``invalid_query``), as a command's unknown fields
are: a mistyped one (``?at_verison=3``, ``?form=1``) would otherwise be ignored, and the answer would look like
the one asked for while it is not (the current state instead of version 3's). What a route takes is what the API
description (``/openapi.json``) lists for it, so the check follows every route, the domain's own queries too. A
route that needs an API key answers a request without a valid one 401 first, as it would without the check."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from commitline.application.boundary import at_most
from commitline.application.errors import printable
from commitline.http.access_log import without_keys
from commitline.http.auth import caller
from commitline.http.problems import InvalidQuery

_CHECKED_PREFIX = "/v1/"


async def documented_query_only(request: Request) -> None:
    """Raise InvalidQuery naming each query parameter the matched GET route does not document. Run on the event
    loop (a request that passes costs no thread); a key is looked up in the thread pool, as the routes do."""
    if not request.query_params or request.method != "GET":
        return
    template = getattr(request.scope.get("route"), "path", None)
    if not isinstance(template, str) or not template.startswith(_CHECKED_PREFIX):
        return
    described = _described(request.app, template)
    if described is None:
        return
    known, secured = described
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in known]
    if unknown:
        if secured:
            # Unauthorized without a valid key: such a caller learns nothing of the route first
            await run_in_threadpool(caller, request)
        takes = ", ".join(sorted(known)) if known else "no query parameters"
        raise InvalidQuery(at_most([{"loc": ["query", without_keys(printable(name, 64))],
                                     "msg": f"not a parameter of this route (it takes {takes})",
                                     "type": "extra_forbidden"} for name in unknown]))


def _described(app: Any, template: str) -> tuple[frozenset[str], bool] | None:
    """The query parameters the description lists for GET ``template`` and whether it needs an API key (None: not
    described, not checked)."""
    cache: dict[str, tuple[frozenset[str], bool] | None] = app.state.__dict__.setdefault("query_parameters", {})
    if template not in cache:
        operation = app.openapi()["paths"].get(template, {}).get("get")
        cache[template] = None if operation is None else (
            frozenset(p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"),
            bool(operation.get("security")))
    return cache[template]
