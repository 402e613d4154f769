"""Tenant-scoped reads over HTTP: aggregates (state, history, state at a version or time, diff) and the
audit chain of one aggregate (the domain's read models are ``queries.py``).

Every route needs the API key; the caller sees only its tenant's aggregates and rows, and another
tenant's id answers exactly as an unused one (404 ``aggregate_not_found``). Aggregate answers are the
documents ``commitline audit ... --json`` prints (``reads_shapes.py`` describes each), replayed from the
events, so they are current as of the request. Read models are built by the projectors (``commitline
project``) and lag the log by their projection's lag; one whose projection has never run is empty.
Routes are plain ``def``: FastAPI runs them in its threadpool, off the event loop.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import orjson
from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BeforeValidator
from starlette.responses import Response

from commitline.application.commands import uuid_text
from commitline.application.errors import printable
from commitline.composition import Commitline
from commitline.http import reads_shapes as shapes
from commitline.http.auth import tenant
from commitline.http.problems import PROBLEM_JSON, InvalidQuery

router = APIRouter(tags=["reads"])

_PROBLEM = {"content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "invalid path or query parameter (`invalid_query`)", **_PROBLEM},
    401: {"description": "missing or unknown API key", **_PROBLEM},
    404: {"description": "no such aggregate or row for this tenant (`aggregate_not_found`)", **_PROBLEM},
    503: {"description": "store unavailable: retry", **_PROBLEM},
    # declared so FastAPI does not document its own 422, which this app never sends for a query
    "default": {"description": "any other error, as a problem document", **_PROBLEM},
}
# A '+' typed into a query string arrives as a space: "...T05:42:00 00:00" can only have meant +00:00.
_PLUS_AS_SPACE = re.compile(r" (\d{2}(?::?\d{2})?)$")
_TIME_EXAMPLE = "2026-11-21T05:42:00Z or 2026-11-21T05:42:00%2B01:00"


def _responses(model: type[shapes.Shape], description: str, *codes: int) -> dict[int | str, dict[str, Any]]:
    errors = {c: _ERRORS[c] for c in [*sorted((401, 503, *codes)), "default"]}
    return {200: {"model": model, "description": description}, **errors}


def _json(value: Any) -> Response:
    return Response(orjson.dumps(value, default=str), media_type="application/json")


def _app(request: Request) -> Commitline:
    return request.app.state.commitline  # type: ignore[no-any-return]


def _query_problem(loc: list[str], msg: str, kind: str) -> InvalidQuery:
    return InvalidQuery([{"loc": loc, "msg": msg, "type": kind}])


def parse_moment(text: str) -> datetime:
    """An ISO 8601 time with a UTC offset (``Z`` included); InvalidQuery naming ``as_of`` otherwise."""
    naive = False
    for candidate in dict.fromkeys((text, _PLUS_AS_SPACE.sub(r"+\1", text))):
        try:
            moment = datetime.fromisoformat(candidate)
        except ValueError:
            continue
        if moment.tzinfo is not None:
            return moment
        naive = True
    if naive:
        raise _query_problem(["query", "as_of"], f"{printable(text, 64)} has no UTC offset; add one, "
                             f"e.g. {_TIME_EXAMPLE}", "timezone_aware")
    raise _query_problem(["query", "as_of"], f"{printable(text, 64)} is not an ISO 8601 time, e.g. {_TIME_EXAMPLE}",
                         "datetime_from_date_parsing")


UuidText = Annotated[UUID, BeforeValidator(uuid_text)]
"""A UUID in a path or a query, in its 8-4-4-4-12 form only, as the OpenAPI document's ``format: uuid`` says."""
AggregateId = Annotated[UuidText, Path(description="the aggregate's id (a UUID)")]
MAX_VERSION = 2**63 - 1  # a stream version is a PostgreSQL bigint


@router.get("/v1/aggregates/{aggregate_id}", summary="An aggregate's current state and version",
            responses=_responses(shapes.AggregateOut, "the state at the last version", 400, 404))
def get_aggregate(request: Request, aggregate_id: AggregateId, caller: str = Depends(tenant)) -> Response:
    now = _app(request).auditor().current(aggregate_id, tenant=caller)
    return _json({"aggregate_id": now.aggregate_id, "aggregate_type": now.aggregate_type, "tenant": caller,
                  "version": now.version, "recorded_at": now.recorded_at, "state": now.state})


@router.get("/v1/aggregates/{aggregate_id}/history", summary="Every event with its transition and the state after it",
            responses=_responses(shapes.HistoryOut, "as `commitline audit history ID --json` prints it", 400, 404))
def get_history(request: Request, aggregate_id: AggregateId,
                compact: bool = Query(False, description="show each collection of more than 50 items in "
                                      "state_after as '<N items>' (as the CLI's table does)"),
                caller: str = Depends(tenant)) -> Response:
    return _json(asdict(_app(request).auditor().history(aggregate_id, compact=compact, tenant=caller)))


@router.get(
    "/v1/aggregates/{aggregate_id}/state", summary="The state at a version or as of a time (replayed)",
    description="At most one of `at_version` and `as_of` (both: 400 `invalid_query`); neither: the state at the "
                "last version. A time needs a UTC offset; encode its `+` as `%2B` (a bare `+` arrives as a space, "
                "which is read as `+` before an offset at the end).",
    responses=_responses(shapes.StateOut, "as `commitline audit state ID --json` prints it", 400, 404)
    | {404: {"description": "no such aggregate for this tenant (`aggregate_not_found`), a version beyond its last "
                            "(`version_beyond_head`), or a time before it was created (`before_creation`)",
             **_PROBLEM}},
)
def get_state(request: Request, aggregate_id: AggregateId,
              at_version: int | None = Query(None, ge=1, le=MAX_VERSION,
                                             description="a version, 1 being the first event"),
              as_of: str | None = Query(None, max_length=64, description=f"ISO 8601 with offset, e.g. {_TIME_EXAMPLE}",
                                        json_schema_extra={"format": "date-time"}),
              caller: str = Depends(tenant)) -> Response:
    if at_version is not None and as_of is not None:
        raise _query_problem(["query"], "give at most one of at_version=N and as_of=TIME; both were given",
                             "at_most_one")
    auditor = _app(request).auditor()
    if at_version is None and as_of is None:
        state = auditor.state_at_version(aggregate_id, None, tenant=caller)
    elif at_version is not None:
        state = auditor.state_at_version(aggregate_id, at_version, tenant=caller)
    else:
        state = auditor.state_as_of(aggregate_id, parse_moment(as_of), tenant=caller)  # type: ignore[arg-type]
    return _json(asdict(state))


@router.get(
    "/v1/aggregates/{aggregate_id}/diff", summary="What changed between two versions, and the events in between",
    description="`from` must not be after `to` (400 `invalid_query`).",
    responses=_responses(shapes.DiffOut, "as `commitline audit diff ID --from N --to M` prints it", 400, 404)
    | {404: {"description": "no such aggregate for this tenant (`aggregate_not_found`) or `to` beyond its last "
                            "version (`version_beyond_head`)", **_PROBLEM}},
)
def get_diff(request: Request, aggregate_id: AggregateId,
             from_version: int = Query(alias="from", ge=0, le=MAX_VERSION,
                                       description="the earlier version (0: before the first "
                                       "event)"),
             to_version: int = Query(alias="to", ge=0, le=MAX_VERSION, description="the later version"),
             caller: str = Depends(tenant)) -> Response:
    if from_version > to_version:
        raise _query_problem(["query", "from"], f"from={from_version} is after to={to_version}", "from_after_to")
    diff = _app(request).auditor().diff(aggregate_id, from_version, to_version, tenant=caller)
    return _json({"aggregate_id": diff.aggregate_id, "aggregate_type": diff.aggregate_type,
                  "from_version": diff.from_version, "to_version": diff.to_version,
                  "changed": {k: {"from": a, "to": b} for k, (a, b) in diff.changed.items()},
                  "events": [asdict(e) for e in diff.events]})


@router.get(
    "/v1/audit/verify/{aggregate_id}", summary="Verify one aggregate's hash chain",
    description="200 whether or not it verifies: `ok` says, and `broken` names the first event that does not "
                "match (its content changed, a link broken, or events removed from its end).",
    responses=_responses(shapes.VerifyOut, "as `commitline audit verify --aggregate ID --json` prints it", 400, 404),
)
def get_verification(request: Request, aggregate_id: AggregateId, caller: str = Depends(tenant)) -> Response:
    report = _app(request).auditor().verify(aggregate_id, tenant=caller)
    return _json(report.document())
