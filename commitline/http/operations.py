"""Operations endpoints: liveness (``/healthz``), readiness (``/readyz``) and Prometheus ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
