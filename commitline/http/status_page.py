"""The operators' status page at ``/``: followers, blocked projections, stuck sagas and the last audit
verification, read-only and refreshing itself; the domain's projections and process managers among them.

``GET /v1/status`` is the JSON the page polls: the facts of ``commitline status --json`` (the log head,
every follower's position, lag, liveness, status and problems, the STUCK sagas), each follower stopped at
a poison event with the commands that unblock it, and the last recorded ``commitline audit verify``.
The page (``static/status.html`` with its script and style, no external assets) renders that JSON and
polls it every few seconds. Both need no API key: they are the operator's view across tenants, show
counts, positions and ids but no event payloads, and belong on the operators' network like ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timezone
from importlib import resources
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from commitline.application.process import StuckInstance
from commitline.composition import PUBLISHER, Commitline
from commitline.http.problems import RouteNotFound

if TYPE_CHECKING:
    from commitline.composition.status import FollowerStatus

router = APIRouter()

_STATIC = resources.files("commitline.http") / "static"
_PAGE = (_STATIC / "status.html").read_bytes()
_ASSETS = {name: ((_STATIC / name).read_bytes(), media_type)
           for name, media_type in (("status.js", "text/javascript; charset=utf-8"),
                                    ("status.css", "text/css; charset=utf-8"))}
# Everything the page loads comes from this server: no CDN, no inline script, nothing else allowed.
_SECURITY = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_FRESH = {"Cache-Control": "no-store"}
REASON = '"<why it is safe>"'


def unblock_commands(follower: FollowerStatus, projections: Collection[str]) -> list[str]:
    """The commands an operator runs for a follower stopped at a poison event: retry it (after fixing the
    cause), or skip exactly that event; for one stopped because the store went back, its resets; [] for a
    follower no command unblocks. ``projections``: the domain's."""
    at = (follower.error or {}).get("position", "N")
    if (follower.error or {}).get("kind") == "store_went_back":  # see docs/guides/failover.md
        return [f"commitline followers reset {follower.name} {choice}" for choice in ("--keep", "--from-head",
                                                                                      "--from N")]
    if follower.name == PUBLISHER:
        return ["commitline publisher retry", f"commitline publisher skip --position {at} --reason {REASON}"]
    if follower.name in projections:
        return [f"commitline projections retry {follower.name}",
                f"commitline projections skip {follower.name} --position {at} --reason {REASON}"]
    return []


def retry_command(stuck: StuckInstance, several: bool) -> str:
    """The command that resumes a saga instance waiting for a person (naming its saga when there are several)."""
    saga = f" --saga {stuck.saga}" if several else ""
    return f"commitline sagas retry {stuck.id} --tenant {stuck.tenant}{saga}"


def status_document(app: Commitline) -> dict[str, Any]:
    """What the status page shows, as JSON (blocking: several reads of the store)."""
    report = app.status()
    last, last_all = app.last_verifications()
    blocked = []
    for s in report.followers:
        if s.status == "failed":
            error = s.error or {}
            blocked.append({"name": s.name, "position": s.position, "poison_position": error.get("position"),
                            "event_type": error.get("event_type"), "message": error.get("message", ""),
                            "alive": s.alive, "commands": unblock_commands(s, app.domain.projections)})
    problems = report.problems()
    stuck = [{"saga": s.saga, "id": str(s.id), "tenant": s.tenant, "state": s.state, "reason": s.reason,
              "command": retry_command(s, len(report.sagas) > 1)} for s in report.stuck]
    return {
        "generated_at": datetime.now(timezone.utc).isoformat(),
        "schema": app.settings.schema_name,
        "head": report.head,
        "healthy": not problems,
        "problems": [str(p) for p in problems],
        "thresholds": {"max_lag_events": report.thresholds.max_lag_events,
                       "max_lag_seconds": report.thresholds.max_lag_seconds},
        "followers": [{**s.as_dict(), "owned_by": report.owner_of(s), "problems": report.reasons(s)}
                      for s in report.followers],
        "publisher": report.publisher_dict() if report.publisher_ran else None,
        "blocked": blocked,
        "stuck_sagas": stuck,
        "stuck_fulfilments": [{**s, "order_id": s["id"]} for s in stuck],  # the name status pages first used
        "audit": {"last": last.as_dict() if last else None,
                  "last_all": last_all.as_dict() if last_all else None},
    }


_FOLLOWER = {"type": "object", "required": ["name", "status", "position", "lag_events", "lag_seconds", "alive"],
             "properties": {"name": {"type": "string"}, "status": {"type": "string"}, "position": {"type": "integer"},
                            "lag_events": {"type": "integer"}, "lag_seconds": {"type": "number"},
                            "alive": {"type": "boolean"}, "problems": {"type": "array", "items": {"type": "string"}},
                            "owned_by": {"type": "string", "description": "the commitline process owning it, as "
                                         "host:pid (kind, started ...) (the publisher's: its instances'), else the "
                                         "owner its row last named, with (last); empty when none ever did"}}}
STATUS_SCHEMA = {
    "type": "object",
    "required": ["generated_at", "schema", "head", "healthy", "problems", "thresholds", "followers", "publisher",
                 "blocked", "stuck_sagas", "audit"],
    "properties": {
        "generated_at": {"type": "string", "format": "date-time"}, "schema": {"type": "string"},
        "head": {"type": "integer"}, "healthy": {"type": "boolean"},
        "problems": {"type": "array", "items": {"type": "string"}},
        "thresholds": {"type": "object", "properties": {"max_lag_events": {"type": "integer"},
                                                        "max_lag_seconds": {"type": "number"}}},
        "followers": {"type": "array", "items": _FOLLOWER},
        "publisher": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["bucket_count", "instances",
                                                                                  "unowned", "buckets"],
                                                   "properties": {"buckets": {"type": "array", "items": _FOLLOWER}}}]},
        "blocked": {"type": "array", "items": {"type": "object"}},
        "stuck_sagas": {"type": "array", "items": {"type": "object"}},
        "audit": {"type": "object", "required": ["last", "last_all"]},
    },
}


@router.get("/v1/status", tags=["operations"], summary="Followers, blocked projections, stuck sagas, last audit",
            responses={200: {"content": {"application/json": {"schema": STATUS_SCHEMA}}}},
            description="The operators' view behind the status page at `/` (no API key; no payloads): the log head; "
            "each follower's position, lag (events and seconds), liveness, status and problems, and each publisher "
            "bucket's (as `commitline status --json`); "
            "followers stopped at a poison event with the commands that unblock them; saga instances waiting for a "
            "person; the last `commitline audit verify` run.")
def status(request: Request) -> Response:
    body = orjson.dumps(status_document(request.app.state.commitline), default=str)
    return Response(body, media_type="application/json", headers=_FRESH)


@router.get("/", include_in_schema=False)
def page() -> Response:
    return Response(_PAGE, media_type="text/html; charset=utf-8", headers={**_SECURITY, **_FRESH})


@router.get("/static/{name}", include_in_schema=False)
def asset(name: str, request: Request) -> Response:
    if name not in _ASSETS:
        raise RouteNotFound(request.url.path)
    body, media_type = _ASSETS[name]
    return Response(body, media_type=media_type, headers={**_SECURITY, "Cache-Control": "no-cache"})
