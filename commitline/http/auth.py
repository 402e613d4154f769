"""Who is calling: ``Authorization: Bearer <api key>`` decides the tenant; nothing the caller sends
besides the key can name one. The key is never logged nor echoed in a problem document. ``admin_key`` is
for the routes only a tenant's administrative key may call (erasing data subjects): any other key gets 403."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.datastructures import Headers

from commitline.http.problems import AdminKeyRequired, DuplicateHeader, Unauthorized

_SCHEME = "bearer"


def tenant(request: Request) -> str:
    """The tenant of the request's API key (a FastAPI dependency); Unauthorized (401) otherwise."""
    return caller(request).tenant  # type: ignore[no-any-return]


def admin_key(request: Request) -> Any:
    """The request's API key (an ``ApiKey``: id, tenant, admin) when it is an administrative one (a FastAPI
    dependency); Unauthorized (401) without a valid key, AdminKeyRequired (403) with an ordinary one."""
    key = caller(request)
    if not key.admin:
        raise AdminKeyRequired(key.tenant, key.key_id)
    return key


def caller(request: Request) -> Any:
    """The request's active API key; Unauthorized (401) otherwise."""
    return resolved(request.app.state.commitline, presented_in(request.headers))


def presented_in(headers: Headers) -> str:
    """The key a request's ``headers`` present, as far as they tell without the database: Unauthorized (401)
    without one, DuplicateHeader (400) with two. ``resolved`` then checks it (a blocking read)."""
    sent = headers.getlist("authorization")
    if len(sent) > 1:  # two keys, perhaps of two tenants: acting as either would be a guess
        raise DuplicateHeader("Authorization", len(sent))
    header = sent[0] if sent else None
    if not header:
        raise Unauthorized("no API key: send Authorization: Bearer <key> (create one with commitline tenants add)")
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != _SCHEME or not key.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <key>'")
    return key.strip()


def resolved(commitline: Any, key: str) -> Any:
    """The active API key ``key`` is (``presented``); Unauthorized (401) for an unknown or revoked one."""
    found = commitline.api_keys().resolve(key)
    if found is None:
        raise Unauthorized("the API key is unknown or revoked")
    return found
