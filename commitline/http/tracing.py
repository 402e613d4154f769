"""The HTTP request's span (OpenTelemetry's ASGI middleware), the root of a command's trace, when tracing
is on (``Commitline.tracing``). Probes, scrapes and static assets are not traced; headers are never
recorded as attributes unless an operator asks for them (``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_*``),
and even then the API key and the idempotency key are redacted."""

from __future__ import annotations

from fastapi import FastAPI

from commitline.composition.observability import EXCLUDED_ROUTES, Tracing

REDACTED_HEADERS = ["authorization", "idempotency-key", "cookie", "proxy-authorization"]


def instrument(app: FastAPI, tracing: Tracing | None) -> None:
    if tracing is None:
        return
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    app.add_middleware(OpenTelemetryMiddleware, tracer_provider=tracing.provider, excluded_urls=EXCLUDED_ROUTES,
                       exclude_spans=["receive", "send"], http_capture_headers_sanitize_fields=REDACTED_HEADERS)
