"""OpenTelemetry traces of a command's whole path: HTTP request -> dispatch -> append (linked to the
group-commit batch it joined) -> publish of each of its events, continued by Kafka consumers.

Off by default. ``tracing_for(settings)`` returns None unless the standard ``OTEL_*`` variables ask for
traces (``OTEL_TRACES_EXPORTER=otlp|console``, or an OTLP endpoint), and every caller keeps None as
"no tracing": no OpenTelemetry import, no span, one ``is None`` test per command and per batch.

What a span carries: the command type, the tenant, the outcome and the error code; never an idempotency
key, an API key or a payload. The append's span context is stored with its events (the W3C
``traceparent`` in the stored state, key ``tp``), so the publisher, in another process and maybe much
later, starts each record's publish span as its child and puts that span's ``traceparent`` in the Kafka
record's headers. Only OTLP over HTTP (protobuf) is installed; spans leave through a batch processor
(its own thread), never on the command's path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from commitline.application.boundary import check_tenant
from commitline.application.errors import CommitlineError, ConfigurationError, StoreUnavailable
from commitline.application.ports import StreamMoved
from commitline.application.processor import DispatchObserver
from commitline.infrastructure.config import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
STORED_KEY = "tp"  # the stored event state's key for the traceparent of the append that wrote it
DEFAULT_OTLP_ENDPOINT = "http://localhost:4318"
#: Probes, scrapes and the status page's assets: no trace each. Regular expressions (comma-separated, as
#: OpenTelemetry reads them) searched in the request's whole URL, ``scheme://host/path``: anchored to the path,
#: so that a host such as ``payments-static.example.com`` does not exclude every request to it.
EXCLUDED_ROUTES = r"^[a-z]+://[^/]*/(healthz|readyz|metrics)/?$,^[a-z]+://[^/]*/static/"


def tracing_enabled(settings: Settings) -> bool:
    if settings.otel_sdk_disabled:
        return False
    exporter = settings.otel_traces_exporter
    if exporter is not None:
        return exporter != "none"
    return settings.otel_exporter_otlp_endpoint is not None or settings.otel_exporter_otlp_traces_endpoint is not None


def traces_endpoint(settings: Settings) -> str:
    """Where OTLP/HTTP spans go: the traces endpoint as given, else ``<endpoint>/v1/traces`` (the spec's rule)."""
    if settings.otel_exporter_otlp_traces_endpoint is not None:
        return settings.otel_exporter_otlp_traces_endpoint
    base = settings.otel_exporter_otlp_endpoint or DEFAULT_OTLP_ENDPOINT
    return f"{base.rstrip('/')}/v1/traces"


_providers: dict[tuple[str, str, str], TracerProvider] = {}
_providers_lock = threading.Lock()
_global_set = False  # whether OpenTelemetry's global provider is one of ours


def _provider(settings: Settings) -> TracerProvider:
    """One provider (and exporting thread) per exporter, endpoint and service name in this process."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    exporter_name = settings.otel_traces_exporter or "otlp"
    endpoint = traces_endpoint(settings) if exporter_name == "otlp" else ""
    key = (exporter_name, endpoint, settings.otel_service_name)
    with _providers_lock:
        provider = _providers.get(key)
        if provider is None:
            if exporter_name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter: Any = OTLPSpanExporter(endpoint=endpoint)  # headers, timeout: OTEL_EXPORTER_OTLP_*
            else:
                exporter = ConsoleSpanExporter()
            provider = TracerProvider(resource=Resource.create({SERVICE_NAME: settings.otel_service_name}))
            provider.add_span_processor(BatchSpanProcessor(exporter))
            _providers[key] = provider
            global _global_set
            if not _global_set:  # the first one only: a team's own spans (in handlers) join the same traces
                trace.set_tracer_provider(provider)
                _global_set = True
            log.info("tracing on: %s spans of service %r%s", exporter_name, settings.otel_service_name,
                     f" to {endpoint}" if endpoint else "")
        return provider


def tracing_for(settings: Settings) -> Tracing | None:
    """The tracing the settings ask for, or None (off: the default)."""
    if not tracing_enabled(settings):
        return None
    if settings.otel_exporter_otlp_protocol not in (None, "http/protobuf"):
        raise ConfigurationError("OTEL_EXPORTER_OTLP_PROTOCOL", f"is {settings.otel_exporter_otlp_protocol!r}; "
                                 "commitline exports OTLP over HTTP only: use http/protobuf")
    return Tracing(_provider(settings))


class _TracedOutcome(DispatchObserver):
    """The dispatch's observer: passes everything on to the metrics, and writes the outcome on the span."""

    def __init__(self, inner: DispatchObserver, span: Span):
        self.inner, self.span = inner, span

    def on_retry(self, command_type: str) -> None:
        self.inner.on_retry(command_type)
        self.span.add_event("commitline.retry", {"reason": "the stream moved meanwhile"})

    def on_outcome(self, command_type: str, outcome: str, code: str | None, seconds: float) -> None:
        self.inner.on_outcome(command_type, outcome, code, seconds)
        span = self.span
        span.update_name(f"dispatch {command_type}")
        span.set_attribute("commitline.command.type", command_type)
        span.set_attribute("commitline.outcome", outcome)
        if code is not None:
            span.set_attribute("commitline.error.code", code)
        if outcome == "failed":
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, code or "failed"))


class AppendTrace:
    """An append's span, and the traceparent stored with its events."""

    __slots__ = ("span", "traceparent")

    def __init__(self, span: Span, traceparent: str):
        self.span, self.traceparent = span, traceparent


class Tracing:
    """The spans commitline makes, over one provider."""

    def __init__(self, provider: TracerProvider):
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("commitline")
        self._propagator = TraceContextTextMapPropagator()

    # -- commands ----------------------------------------------------------------------

    @contextmanager
    def dispatch(self, tenant: object, observer: DispatchObserver) -> Iterator[DispatchObserver]:
        """The dispatch span (current while the command runs, so its append is its child); the observer
        to report the outcome to."""
        try:
            attributes = {"commitline.tenant": check_tenant(tenant)}
        except CommitlineError:
            attributes = {}  # refused as invalid_tenant: caller text that is no tenant is not recorded
        with self.tracer.start_as_current_span("dispatch", attributes=attributes, record_exception=False,
                                               set_status_on_exception=False) as span:
            yield _TracedOutcome(observer, span)

    @contextmanager
    def append(self, events: int) -> Iterator[AppendTrace | None]:
        """The append span of one command's events (a child of its dispatch); None when its trace is not
        sampled (nothing is stored then, so its publication is not traced either)."""
        from opentelemetry import trace

        with self.tracer.start_as_current_span("append", attributes={"commitline.events": events},
                                               record_exception=False, set_status_on_exception=False) as span:
            try:
                if not span.is_recording():
                    yield None
                    return
                carrier: dict[str, str] = {}
                self._propagator.inject(carrier, context=trace.set_span_in_context(span))
                yield AppendTrace(span, carrier.get(TRACEPARENT, ""))
            except BaseException as e:
                # the stream moved (the command runs again: a routine retry) or the command was refused: no error
                if not isinstance(e, StreamMoved) and (not isinstance(e, CommitlineError)
                                                       or isinstance(e, StoreUnavailable)):
                    span.set_status(trace.Status(trace.StatusCode.ERROR, type(e).__name__))
                raise

    @contextmanager
    def batch(self, appends: Sequence[AppendTrace], commands: int) -> Iterator[None]:
        """The group-commit batch's span (in the leading thread, a trace of its own), linked both ways with the
        appends in it; none for a batch without a sampled append."""
        if not appends:
            yield
            return
        from opentelemetry.context import Context
        from opentelemetry.trace import Link

        links = [Link(a.span.get_span_context()) for a in appends]
        # A root of its own, not the child of the leading thread's append: it serves every append in it.
        with self.tracer.start_as_current_span("group commit", context=Context(), links=links, attributes={
                "commitline.batch.commands": commands}, record_exception=False) as span:
            yield
        context = span.get_span_context()
        for a in appends:
            a.span.add_link(context, {"commitline.link": "group commit batch"})

    # -- publishing --------------------------------------------------------------------

    def publish_spans(self, records: Mapping[int, Sequence[Any]]) -> dict[int, Span]:
        """A publish span per record (of each bucket's ``KafkaRecord`` list) stored with a traceparent, a child
        of it, by notification id; the span's own traceparent goes into the record's headers, so a consumer
        continues the trace."""
        from opentelemetry import trace

        spans = {}
        for batch in records.values():
            for record in batch:
                if not record.traceparent:
                    continue
                parent = self._propagator.extract({TRACEPARENT: record.traceparent})
                span = self.tracer.start_span(f"publish {record.topic}", context=parent, kind=trace.SpanKind.PRODUCER,
                                              attributes={"messaging.system": "kafka",
                                                          "messaging.operation.type": "send",
                                                          "messaging.destination.name": record.topic,
                                                          "commitline.notification_id": record.notification_id})
                carrier: dict[str, str] = {}
                self._propagator.inject(carrier, context=trace.set_span_in_context(span))
                record.headers[:] = [h for h in record.headers if h[0] != TRACEPARENT]  # a record sent again
                record.headers.append((TRACEPARENT, carrier[TRACEPARENT].encode()))
                spans[record.notification_id] = span
        return spans

    @staticmethod
    def end_publish(spans: Iterable[Span], error: BaseException | None = None, *,
                    sent: Collection[int] | None = None) -> None:
        """End the publish spans once the broker acknowledged their records: with ``error``, every one failed;
        with ``sent``, those of other records (held back at a poison record) did."""
        from opentelemetry.trace import Status, StatusCode

        for span in spans:
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            elif sent is not None and span.attributes.get("commitline.notification_id") not in sent:
                span.set_status(Status(StatusCode.ERROR, "not sent: the bucket stopped at a poison record"))
            span.end()

    def flush(self, timeout_ms: int = 10_000) -> None:
        self.provider.force_flush(timeout_ms)
