"""Every Prometheus metric commitline exports, in one place, and the registries that expose them.

- Recorded as things happen (module-level ``prometheus_client`` metrics): commands by type, outcome
  and error code, dispatch latency, re-runs after the stream moved, version conflicts (``CommandMetrics``,
  the application's ``DispatchObserver``), and HTTP requests by route and status (``observe_request``).
- Read at scrape time from PostgreSQL (``StoreCollector`` over ``Commitline.status()``): the log head,
  each follower's position, lag, liveness and status, STUCK sagas, and whether that read worked.
- Read at scrape time from the followers this process runs (``FollowerCollector``): their own counters.

A follower process's metrics port (``MetricsServer``) also answers ``/healthz``: the process's liveness,
for a container health check (``infrastructure/liveness.py``).

Several ``commitline serve`` workers write their recorded metrics to ``PROMETHEUS_MULTIPROC_DIR``
(``serve`` sets it before any worker starts); ``scrape_registry`` then sums every worker's files, and the
PostgreSQL collector runs only in the worker answering the scrape. Labels never carry caller-supplied
text: command types outside the domain's are ``unknown``, routes are templates, never paths.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (REGISTRY, CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest, make_wsgi_app)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from commitline.application.errors import ConfigurationError
from commitline.application.processor import DispatchObserver

log = logging.getLogger(__name__)
# No ``*_created`` series beside each counter and histogram: the reference does not list them, and several serve
# workers (multiprocess mode) never had them, so the metrics would differ with the number of workers.
disable_created_metrics()
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

COMMANDS = Counter("commitline_commands", "Commands dispatched, by type, outcome (applied, replayed, refused, "
                   "failed) and error code (empty unless refused or failed)", ["type", "outcome", "code"])
DISPATCH_SECONDS = Histogram("commitline_dispatch_seconds", "Time to dispatch one command (any outcome), by type",
                             ["type"], buckets=_LATENCY_BUCKETS)
RETRIES = Counter("commitline_dispatch_retries", "Commands re-run because their stream moved meanwhile "
                  "(no expected_version), by type", ["type"])
CONFLICTS = Counter("commitline_conflicts", "Commands refused with a version conflict (concurrency_conflict), "
                    "by type", ["type"])
HTTP_REQUESTS = Counter("commitline_http_requests", "HTTP requests answered, by method, route template and status",
                        ["method", "route", "status"])
HTTP_SECONDS = Histogram("commitline_http_request_seconds", "Time to answer an HTTP request, by method and route "
                         "template", ["method", "route"], buckets=_LATENCY_BUCKETS)


class CommandMetrics(DispatchObserver):
    """The command processor's observer: records every dispatch in the metrics above. Each labelled child
    is looked up once (``labels`` costs more than the increment itself, on every command)."""

    def __init__(self) -> None:
        self._counted: dict[tuple[str, str, str | None], Callable[[], None]] = {}
        self._timed: dict[str, Callable[[float], None]] = {}

    def on_retry(self, command_type: str) -> None:
        RETRIES.labels(command_type).inc()

    def on_outcome(self, command_type: str, outcome: str, code: str | None, seconds: float) -> None:
        labels = (command_type, outcome, code)
        count = self._counted.get(labels)
        if count is None:
            count = self._counted.setdefault(labels, COMMANDS.labels(command_type, outcome, code or "").inc)
        count()
        observe = self._timed.get(command_type)
        if observe is None:
            observe = self._timed.setdefault(command_type, DISPATCH_SECONDS.labels(command_type).observe)
        observe(seconds)
        if code == "concurrency_conflict":
            CONFLICTS.labels(command_type).inc()


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    HTTP_REQUESTS.labels(method, route, str(status)).inc()
    HTTP_SECONDS.labels(method, route).observe(seconds)


#: The longest a scrape waits for the status read: an outage must read as ``commitline_store_up 0`` within a
#: scraper's timeout (Prometheus' default is 10 s), not as a failed scrape after the pool's own wait.
STATUS_READ_TIMEOUT_S = 3.0


class StatusReadTimedOut(Exception):
    pass


class StoreCollector(Collector):
    """Follower positions and lag, read from PostgreSQL at each scrape through ``status`` (a
    ``Commitline.status``). A failed read is exported as ``commitline_store_up 0``, not as a failed scrape."""

    def __init__(self, status: Callable[[], Any], timeout_s: float = STATUS_READ_TIMEOUT_S):
        self.status = status
        self.timeout_s = timeout_s

    def describe(self) -> list[Metric]:
        return []  # registering must not query PostgreSQL

    def _read(self) -> Any:
        """``status()``, given up on (``StatusReadTimedOut``) after ``timeout_s``; the read itself ends in its
        thread, on the pool's own timeout."""
        done: list[Any] = []
        failed: list[BaseException] = []

        def read() -> None:
            try:
                done.append(self.status())
            except BaseException as e:  # handed to the scrape
                failed.append(e)

        reader = threading.Thread(target=read, name="commitline metrics status read", daemon=True)
        reader.start()
        reader.join(self.timeout_s)
        if failed:
            raise failed[0]
        if not done:
            raise StatusReadTimedOut(f"no answer within {self.timeout_s} s")
        return done[0]

    def collect(self) -> Iterator[Metric]:
        up = _gauge("commitline_store_up")
        try:
            report = self._read()
        except Exception as e:  # the store's failure is what this metric reports; the scrape still answers
            log.warning("metrics: cannot read follower status from PostgreSQL: %s", type(e).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield _gauge("commitline_log_head", report.head)
        status = _gauge("commitline_follower_status")
        for f in report.followers:
            status.add_metric([f.name, f.status], 1)
        yield from _progress("commitline_follower", "follower", _FOLLOWER_HELP, ((f.name, f) for f in report.followers))
        yield status
        if report.publisher is not None:
            yield from _progress("commitline_publisher_bucket", "bucket", _BUCKET_HELP,
                                 ((str(b), bucket) for b, bucket in enumerate(report.publisher.buckets)))
        stuck = _gauge("commitline_sagas_stuck")
        for saga in report.sagas:
            stuck.add_metric([saga], sum(1 for s in report.stuck if s.saga == saga))
        yield stuck
        # the same, summed, under the name earlier versions exported (alerts written against it keep working)
        yield _gauge("commitline_fulfilments_stuck", len(report.stuck))


# The gauges read from PostgreSQL at each scrape: name -> (help, labels).
_STORE_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "commitline_store_up": ("1 if PostgreSQL answered this scrape's status read, else 0", ()),
    "commitline_log_head": ("Position of the last event in the notification log", ()),
    "commitline_follower_status": ("1 for the follower's current status (running, retrying, failed, stopped, "
                                   "yielded, dead, never run)", ("follower", "status")),
    "commitline_sagas_stuck": ("Saga instances waiting for an operator (STUCK or PARKED), per process manager",
                               ("saga",)),
    "commitline_fulfilments_stuck": ("Saga instances waiting for an operator, every process manager together (the "
                                     "earlier name of commitline_sagas_stuck)", ()),
}


def _gauge(name: str, value: float | None = None) -> GaugeMetricFamily:
    text, labels = _STORE_GAUGES[name]
    if value is not None:
        return GaugeMetricFamily(name, text, value=value)
    return GaugeMetricFamily(name, text, labels=list(labels)) if labels else GaugeMetricFamily(name, text)


_FOLLOWER_HELP = {
    "position": "Last log position the follower handled",
    "lag_events": "Events in the log after the follower's position",
    "lag_seconds": "Age of the oldest event the follower has not handled (0 when caught up)",
    "alive": "1 while a live PostgreSQL session holds the follower's lease, else 0",
}
_BUCKET_HELP = {
    "position": "Last log position the publisher bucket published (every event of the bucket up to it is in Kafka)",
    "lag_events": "Events of the bucket not published yet",
    "lag_seconds": "Age of the bucket's oldest event not published yet (0 when caught up)",
    "alive": "1 while a live publish instance owns the bucket, else 0",
}


def _progress(prefix: str, label: str, help_texts: Mapping[str, str], rows: Iterable[tuple[str, Any]]) -> list[Metric]:
    """``<prefix>_position``, ``_lag_events``, ``_lag_seconds`` and ``_alive`` of each (label value, status) row."""
    families = {name: GaugeMetricFamily(f"{prefix}_{name}", text, labels=[label]) for name, text in help_texts.items()}
    for value, s in rows:
        families["position"].add_metric([value], s.position)
        families["lag_events"].add_metric([value], s.lag_events)
        families["lag_seconds"].add_metric([value], s.lag_seconds)
        families["alive"].add_metric([value], 1 if s.alive else 0)
    return list(families.values())


# A follower's own counters: (metric suffix, help, attribute of its ``metrics`` or of itself), where it has one.
_FOLLOWER_COUNTERS = (
    ("events_handled", "Events this process's follower handled (published or applied)",
     ("events_published", "events_applied")),
    ("batches", "Batches this process's follower handled", ("batches",)),
    ("errors", "Failed attempts this process's follower retried (Kafka or PostgreSQL unavailable, a handler "
     "failing)", ("failed_attempts",)),
    ("sagas_advanced", "Saga instances this process's process-manager runner advanced", ("advanced",)),
    ("sagas_parked", "Saga instances this process's process-manager runner parked after their attempts failed",
     ("parked",)),
)


class FollowerCollector(Collector):
    """The counters of the followers running in this process (``publish``, ``project``, ``sagas run``),
    read from each follower's ``metrics`` at scrape time; a counter a follower does not keep is left out."""

    def __init__(self, followers: Sequence[Any]):
        self.followers = list(followers)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for suffix, text, attributes in _FOLLOWER_COUNTERS:
            family = CounterMetricFamily(f"commitline_follower_{suffix}", text, labels=["follower"])
            for follower in self.followers:
                value = next((getattr(source, a) for a in attributes for source in (follower.metrics, follower)
                              if hasattr(source, a)), None)
                if value is not None:
                    family.add_metric([follower.lease.name], value)
            if family.samples:
                yield family


class _Forward(Collector):
    """Everything in another registry (this process's recorded metrics)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return self.registry.collect()


def multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_DIR))


def scrape_registry(status: Callable[[], Any] | None = None, followers: Sequence[Any] = ()) -> CollectorRegistry:
    """What a scrape exposes: the recorded metrics (every worker's, in multiprocess mode), then the
    PostgreSQL reads through ``status`` and the counters of ``followers``."""
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess():
        MultiProcessCollector(registry)
    else:
        registry.register(_Forward(REGISTRY))
    if status is not None:
        registry.register(StoreCollector(status))
    if followers:
        registry.register(FollowerCollector(followers))
    return registry


def render(status: Callable[[], Any] | None = None) -> bytes:
    """One scrape in the Prometheus text format."""
    return generate_latest(scrape_registry(status))


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes and health checks are not news
        pass


def _with_health(metrics_app: Any, problem: Callable[[], str | None]) -> Any:
    """``/healthz``: 200 while ``problem()`` is None, else 503 with its text; ``/metrics``: the metrics; any other
    path 404 (a mistyped scrape path would otherwise look like a healthy target)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path != "/healthz":
            body = b"not found: this port serves /metrics and /healthz\n"
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8"),
                                             ("Content-Length", str(len(body)))])
            return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]
        reason = problem()
        body = f"{reason or 'ok'}\n".encode()
        start_response("200 OK" if reason is None else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    return app


class MetricsServer:
    """``/metrics`` of a follower process, and ``/healthz`` (is this process's follower loop alive:
    ``liveness``), on its own port (a daemon thread); ``close()`` stops it."""

    def __init__(self, host: str, port: int, status: Callable[[], Any], followers: Sequence[Any],
                 liveness: Callable[[], str | None] = lambda: None):
        server_class = type("MetricsHTTPServer", (_ThreadingServer,), {
            "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        app = _with_health(make_wsgi_app(scrape_registry(status, followers)), liveness)
        try:
            self.server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        except OSError as e:
            raise ConfigurationError("--metrics-port", f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        self.thread = threading.Thread(target=self.server.serve_forever, name="commitline-metrics", daemon=True)
        self.thread.start()
        self.host, self.port = host, self.server.server_port
        log.info("Prometheus metrics at http://%s:%d/metrics, liveness at /healthz", host, self.port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def catalogue() -> list[tuple[str, str, tuple[str, ...], str]]:
    """Every metric commitline can export, as (name, type, labels, help): what the reference documents."""
    rows = [(m._name, m._type, tuple(m._labelnames), m._documentation)
            for m in (COMMANDS, DISPATCH_SECONDS, RETRIES, CONFLICTS, HTTP_REQUESTS, HTTP_SECONDS)]
    rows += [(name, "gauge", labels, text) for name, (text, labels) in _STORE_GAUGES.items()]
    rows += [(f"{prefix}_{name}", "gauge", (label,), text)
             for prefix, label, texts in (("commitline_follower", "follower", _FOLLOWER_HELP),
                                          ("commitline_publisher_bucket", "bucket", _BUCKET_HELP))
             for name, text in texts.items()]
    rows += [(f"commitline_follower_{suffix}", "counter", ("follower",), text) for suffix, text, _ in _FOLLOWER_COUNTERS]
    return sorted(rows)
