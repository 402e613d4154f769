"""The operators' status page at ``/``: followers, blocked projections, stuck sagas and the last audit
verification, read-only and refreshing itself."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
