"""Who is calling: ``Authorization: Bearer <api key>`` decides the tenant; nothing the caller sends
besides the key can name one. The key is never logged nor echoed in a problem document."""

from __future__ import annotations

from fastapi import Request

from commitline.http.problems import DuplicateHeader, Unauthorized

_SCHEME = "bearer"


def tenant(request: Request) -> str:
    """The tenant of the request's API key (a FastAPI dependency); Unauthorized (401) otherwise."""
    sent = request.headers.getlist("authorization")
    if len(sent) > 1:  # two keys, perhaps of two tenants: acting as either would be a guess
        raise DuplicateHeader("Authorization", len(sent))
    header = sent[0] if sent else None
    if not header:
        raise Unauthorized("no API key: send Authorization: Bearer <key> (create one with commitline tenants add)")
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != _SCHEME or not key.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <key>'")
    found = request.app.state.commitline.api_keys().tenant_for(key.strip())
    if found is None:
        raise Unauthorized("the API key is unknown or revoked")
    return found
