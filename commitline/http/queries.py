"""The domain's read-model queries over HTTP: ``GET /v1/read-models/<path>`` for each ``Domain.query``.

A route is made from the query function's own signature: its parameters after ``(reads, tenant)`` are
the path's ``{name}`` parts and query parameters, typed and validated by FastAPI (a bad one answers 400
``invalid_query``). The tenant is the API key's, as for every read; the function's answer is sent as JSON
(orjson: UUIDs and decimals as strings), and an ``AggregateNotFound`` it raises answers 404. Routes are
plain functions run in the threadpool, off the event loop.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any, Optional
from uuid import UUID

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from commitline.composition import Domain, Query
from commitline.http.auth import tenant
from commitline.http.problems import PROBLEM_JSON
from commitline.http.reads import UuidText

PREFIX = "/v1/read-models/"
_PROBLEM = {"content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def router_for(domain: Domain) -> APIRouter:
    router = APIRouter(tags=["read models"])
    for declared in domain.queries:
        query = declared.value
        router.add_api_route(PREFIX + query.path, _endpoint(query), methods=["GET"], summary=query.summary or None,
                             responses=_responses(query), name=f"read-model {query.path}")
    return router


def _strict_ids(annotation: Any) -> Any:
    """A parameter declared ``UUID`` (or ``UUID | None``) takes the 8-4-4-4-12 form only, as ``format: uuid``."""
    if annotation is UUID:
        return UuidText
    if annotation == Optional[UUID]:  # equal to UUID | None too
        return Optional[UuidText]
    return annotation


def _endpoint(query: Query) -> Any:
    signature = inspect.signature(query.function)
    hints = typing.get_type_hints(query.function, include_extras=True)  # the module's names, not ours
    own = [p.replace(annotation=_strict_ids(hints.get(p.name, p.annotation)))
           for p in list(signature.parameters.values())[2:]]  # after (reads, tenant)

    def endpoint(request: Request, caller: str = Depends(tenant), **params: Any) -> Response:
        reads = request.app.state.commitline.read_models()
        return Response(orjson.dumps(query.function(reads, caller, **params), default=str),
                        media_type="application/json")

    fixed = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
             inspect.Parameter("caller", inspect.Parameter.KEYWORD_ONLY, default=Depends(tenant), annotation=str)]
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*fixed, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own)])
    endpoint.__name__ = query.function.__name__
    endpoint.__doc__ = query.function.__doc__
    return endpoint


def _responses(query: Query) -> dict[int | str, dict[str, Any]]:
    answer: dict[str, Any] = {"description": query.summary or "the query's answer"}
    if query.response is not None:
        answer["model"] = query.response
    errors = {
        400: "invalid path or query parameter (`invalid_query`)",
        401: "missing or unknown API key",
        404: "no such aggregate or row for this tenant (`aggregate_not_found`)",
        503: "store unavailable: retry",
        "default": "any other error, as a problem document",
    }
    return {200: answer, **{code: {"description": text, **_PROBLEM} for code, text in errors.items()}}
