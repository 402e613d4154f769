"""The HTTP request's span (OpenTelemetry's ASGI middleware), the root of a command's trace, when tracing
is on (``Commitline.tracing``). Probes, scrapes and static assets are not traced; headers are never
recorded as attributes unless an operator asks for them (``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_*``),
and even then the API key and the idempotency key are redacted."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from commitline.composition.observability import EXCLUDED_ROUTES, Tracing
from commitline.http.access_log import without_keys

REDACTED_HEADERS = ["authorization", "idempotency-key", "cookie", "proxy-authorization"]


def instrument(app: FastAPI, tracing: Tracing | None) -> None:
    if tracing is None:
        return
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    app.add_middleware(OpenTelemetryMiddleware, tracer_provider=tracing.provider, excluded_urls=EXCLUDED_ROUTES,
                       exclude_spans=["receive", "send"], http_capture_headers_sanitize_fields=REDACTED_HEADERS,
                       default_span_details=_span_details, server_request_hook=_without_keys)


def _span_details(scope: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The span's first name, before routing: the method and the path, a key pasted into it not shown."""
    return f"{scope.get('method', 'HTTP')} {without_keys(scope.get('path', ''))}", {}


def _without_keys(span: Any, scope: dict[str, Any]) -> None:
    """The request's attributes (its URL, target, path, query, and the headers an operator asked to capture,
    each a list of values, whatever the header: ``X-Api-Key`` too) with a key pasted into them shown as
    ``clk_<redacted>``, as the access log shows them."""
    if span is None or not span.is_recording():
        return
    for name, value in dict(getattr(span, "attributes", None) or {}).items():
        if isinstance(value, str) and "clk_" in value:
            span.set_attribute(name, without_keys(value))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, str) and "clk_" in v for v in value):
            span.set_attribute(name, [without_keys(v) if isinstance(v, str) else v for v in value])
