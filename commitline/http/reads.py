"""Tenant-scoped reads over HTTP: aggregates (state, history, state at a version or time, diff), the
audit chain of one aggregate, and the read models."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
