"""What the HTTP server measures and traces with: each request counted and timed (``observe_request``), and
the tracing of a worker that serves before it has bootstrapped (``tracing_from_environment``); the routes
that are never traced (``EXCLUDED_ROUTES``). A bootstrapped ``Commitline`` carries its own ``tracing`` and
renders its metrics (``metrics_text``)."""

from __future__ import annotations

from commitline.infrastructure.config import load_settings
from commitline.infrastructure.metrics import observe_request
from commitline.infrastructure.tracing import EXCLUDED_ROUTES, Tracing, tracing_for


def tracing_from_environment() -> Tracing | None:
    """The tracing the environment's OTEL_* settings ask for, or None (off: the default)."""
    return tracing_for(load_settings())


__all__ = ["EXCLUDED_ROUTES", "Tracing", "observe_request", "tracing_from_environment"]
