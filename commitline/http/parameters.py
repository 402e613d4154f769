"""Query parameters a ``/v1`` route does not take are refused (400 ``invalid_query``), as a command's unknown fields
are: a mistyped one (``?at_verison=3``, ``?form=1``) would otherwise be ignored, and the answer would look like
the one asked for while it is not (the current state instead of version 3's; for a write, ``POST /v1/erasures?
subject=s1`` erasing the body's subject and not s1). What a route takes is what the API
description (``/openapi.json``) lists for it, so the check follows every route, the domain's own queries too. A
route that needs an API key answers a request without a valid one 401 first, as it would without the check. A
parameter given twice is refused too (``?at_version=1&at_version=2``: which one counts would be a guess), unless
it takes a list."""

from __future__ import annotations

from collections import Counter
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
    """Raise InvalidQuery naming each query parameter the matched route does not document (for its method; HEAD
    as GET). Run on the event loop (a request that passes costs no thread); a key is looked up in the thread
    pool, as the routes do."""
    if not request.query_params:
        return
    template = getattr(request.scope.get("route"), "path", None)
    if not isinstance(template, str) or not template.startswith(_CHECKED_PREFIX):
        return
    method = "get" if request.method == "HEAD" else request.method.lower()
    described = _described(request.app, template, method)
    if described is None:
        return
    known, lists, secured = described
    refusal = refused_query([name for name, _ in request.query_params.multi_items()], known, lists)
    if refusal is not None:
        if secured:
            # Unauthorized without a valid key: such a caller learns nothing of the route first
            await run_in_threadpool(caller, request)
        raise refusal


def refused_query(names: list[str], known: frozenset[str] = frozenset(),
                  lists: frozenset[str] = frozenset()) -> InvalidQuery | None:
    """The refusal of a request whose query parameters are ``names`` (each as often as sent), for a route that
    takes ``known`` (those in ``lists`` any number of times); None when there is nothing to refuse."""
    sent = Counter(names)
    unknown = [name for name in sent if name not in known]
    repeated = [name for name, count in sent.items() if count > 1 and name in known and name not in lists]
    if not unknown and not repeated:
        return None
    takes = ", ".join(sorted(known)) if known else "no query parameters"
    return InvalidQuery(at_most(
        [{"loc": ["query", without_keys(printable(name, 64))],
          "msg": f"not a parameter of this route (it takes {takes})", "type": "extra_forbidden"}
         for name in unknown] +
        [{"loc": ["query", name], "msg": f"given {sent[name]} times: give it once (which one counts would be "
          "a guess)", "type": "duplicate_parameter"} for name in repeated]))


def _described(app: Any, template: str, method: str) -> tuple[frozenset[str], frozenset[str], bool] | None:
    """The query parameters the description lists for ``method`` on ``template``, those of them that take a list
    (given once per item), and whether it needs an API key (None: not described, not checked)."""
    cache: dict[tuple[str, str], Any] = app.state.__dict__.setdefault("query_parameters", {})
    if (template, method) not in cache:
        operation = app.openapi()["paths"].get(template, {}).get(method)
        query = [p for p in (operation or {}).get("parameters", []) if p.get("in") == "query"]
        cache[template, method] = None if operation is None else (
            frozenset(p["name"] for p in query),
            frozenset(p["name"] for p in query if _takes_a_list(p.get("schema", {}))),
            bool(operation.get("security")))
    return cache[template, method]


def _takes_a_list(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "array" or any(_takes_a_list(s) for s in schema.get("anyOf", []))
