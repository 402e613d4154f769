"""``commitline serve``: the HTTP API on uvicorn, with one or more worker processes sharing the database.

The serving process bootstraps first (schema migrated, the data folder's embedded PostgreSQL started or
reused when no database is configured), so workers start on a current schema and find the same embedded
server; it keeps that server until the last worker has stopped.

With several workers, each records its metrics in files under ``PROMETHEUS_MULTIPROC_DIR``, a fresh
directory this process makes before ``prometheus_client`` is first imported (it picks its mode at import)
and removes once every worker has stopped, so ``/metrics`` from any worker sums them all.

With an operators' port (``--operator-port``, ``COMMITLINE_HTTP_OPERATOR_PORT``) the status page, ``/v1/status``
and ``/metrics`` are served there by this process (``http/operators.py``) and not on the API's port.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psutil

from commitline.cli.common import (APP_SPEC, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, domain, tcp_port,
                                   warn_of_new_store)

UNRESOLVED = "the host does not resolve"
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"  # = infrastructure.metrics.MULTIPROC_DIR, which must not be imported yet


METRICS_PREFIX = "commitline-metrics-"  # then the pid of the serve that made the directory


def _remove_stale_metrics_files() -> None:
    """Remove the metrics directories of serve processes that are gone (killed before they could remove their
    own); a directory whose pid runs (a live serve, or a process that reused the pid) is left."""
    for path in Path(tempfile.gettempdir()).glob(f"{METRICS_PREFIX}*-*"):
        pid = path.name[len(METRICS_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def metrics_files(workers: int) -> Iterator[None]:
    """A fresh multiprocess metrics directory for several workers (left-over counts would be summed in); none,
    and an inherited setting dropped, for one."""
    if workers == 1:
        os.environ.pop(MULTIPROC_DIR, None)
        yield
        return
    _remove_stale_metrics_files()
    directory = tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{os.getpid()}-")
    os.environ[MULTIPROC_DIR] = directory
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def environment_for_workers(workers: int, operator_port: int | None) -> Iterator[None]:
    """Worker processes load the domain from ``COMMITLINE_APP`` (set to the one ``--app`` chose, if any), and leave
    the operators' views out when ``COMMITLINE_HTTP_OPERATOR_PORT`` is set (to ``--operator-port``, if given)."""
    wanted = {"COMMITLINE_APP": APP_SPEC[0],
              "COMMITLINE_HTTP_OPERATOR_PORT": None if operator_port is None else str(operator_port)}
    wanted = {name: value for name, value in wanted.items() if value is not None and workers > 1}
    before = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def cmd_serve(args: argparse.Namespace) -> int:
    from commitline.composition import load_settings
    from commitline.http.access_log import log_config

    settings = load_settings()
    host = args.host or settings.http_host
    port = settings.http_port if args.port is None else args.port
    workers = args.workers or settings.http_workers
    operator_host = args.operator_host or settings.http_operator_host
    operator_port = settings.http_operator_port if args.operator_port is None else args.operator_port
    from commitline.composition import logs

    options = {"host": host, "port": port, "access_log": not args.no_access_log,
               "log_level": logs.chosen_level("INFO").lower(),
               "timeout_graceful_shutdown": 30, "log_config": log_config()}
    if operator_port is not None and operator_port == port:
        print(f"commitline serve: the operators' port {operator_port} is the API's port: choose another "
              "--operator-port (or none, to serve the operators' views on the API's port)", file=sys.stderr)
        return EXIT_USAGE
    listens = [(host, port, "--port")] + ([] if operator_port is None else [(operator_host, operator_port,
                                                                             "--operator-port")])
    for where, number, flag in listens:
        if (taken := _taken(where, number)) is not None:
            advice = (f"choose another {flag.replace('port', 'host')}" if taken.startswith(UNRESOLVED) else
                      f"another serve, or another program, holds it: stop it, or choose another {flag}")
            print(f"commitline serve: cannot listen on {where}:{number}: {taken} ({advice})", file=sys.stderr)
            return EXIT_UNAVAILABLE
    chosen = domain()
    with metrics_files(workers), environment_for_workers(workers, operator_port):
        import uvicorn

        from commitline.composition import bootstrap
        from commitline.http.app import create_app, freeze_startup_heap
        from commitline.http.operations import note_readiness
        from commitline.http.operators import OperatorListener

        # One worker dispatches here, on a CPU of its own; several claim theirs in their own processes.
        with bootstrap(settings, domain=chosen, dispatch_cpu="auto" if workers == 1 else "off") as app, \
                ExitStack() as operators:
            warn_of_new_store(app)
            if operator_port is not None:
                try:
                    operators.enter_context(OperatorListener(app, operator_host, operator_port,
                                                             access_log=not args.no_access_log))
                except OSError as e:
                    print(f"commitline serve: {e}", file=sys.stderr)
                    return EXIT_UNAVAILABLE
            if workers == 1:
                app.dispatch_cpu.enter()  # the event loop too, and the threads it starts: the whole worker
                # uvicorn raises the signal it stopped on again once it has shut down, with the handler it found:
                # SIGTERM's default would end the process with 143, where a clean stop is 0 (as with --workers N).
                signal.signal(signal.SIGTERM, lambda signum, frame: None)
                served = create_app(app, operator_views=operator_port is None)
                note_readiness(served.state, app.unready())
                freeze_startup_heap()
                uvicorn.run(served, **options)
            else:
                supervisor = run_workers(uvicorn.Config("commitline.http.app:app_from_environment", factory=True,
                                                        workers=workers, **options))
                if not supervisor.stopped_by_signal:
                    print("commitline serve: a worker could not start (its log above says why), and the workers "
                          "were stopped", file=sys.stderr)
                    return EXIT_UNAVAILABLE
    return EXIT_OK


def run_workers(config: Any) -> Any:
    """uvicorn's worker supervisor, as ``uvicorn.run`` starts it for several workers, telling afterwards whether a
    signal stopped it: it also stops every worker when one fails to start, and serve must not exit 0 then."""
    from uvicorn.supervisors.multiprocess import Multiprocess

    class Supervisor(Multiprocess):
        stopped_by_signal = False

        def handle_int(self) -> None:
            self.stopped_by_signal = True
            super().handle_int()

        def handle_term(self) -> None:
            self.stopped_by_signal = True
            super().handle_term()

    supervisor = Supervisor(config, sockets=[config.bind_socket()])
    try:
        supervisor.run()
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl-C while stopping
        supervisor.stopped_by_signal = True
    return supervisor


def _taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (in use, say), before anything starts; None when it can. (uvicorn's
    own refusal, after the whole start, names neither the address nor what to do.)"""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"{UNRESOLVED} ({e.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is free
        try:
            probe.bind(address)
        except OSError as e:
            return e.strerror or str(e)
    return None


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return int(text)


def _workers(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers (1-64)")
    return int(text)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = sub.add_parser("serve", help="serve the HTTP API (commands, reads, health, metrics, status page)",
                           description="POST /v1/commands with Authorization: Bearer <key> (commitline tenants add) "
                           "and an Idempotency-Key; OpenAPI at /openapi.json, docs at /docs. Stops on SIGINT/SIGTERM "
                           "after finishing the requests in flight.")
    serve.add_argument("--host", help="address to listen on (default COMMITLINE_HTTP_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="port to listen on (default COMMITLINE_HTTP_PORT, 8080)")
    serve.add_argument("--workers", type=_workers, metavar="N",
                       help="worker processes sharing the database (default COMMITLINE_HTTP_WORKERS, 1)")
    serve.add_argument("--operator-port", type=tcp_port, metavar="PORT",
                       help="serve the operators' views (the status page at /, /v1/status, /metrics; no API key, "
                       "every tenant's followers and stuck sagas) only on this port, apart from the API's, which "
                       "then answers them 404 (default COMMITLINE_HTTP_OPERATOR_PORT; unset: on the API's port)")
    serve.add_argument("--operator-host", metavar="HOST",
                       help="address the operators' port listens on (default COMMITLINE_HTTP_OPERATOR_HOST, "
                       "127.0.0.1)")
    serve.add_argument("--no-access-log", action="store_true", help="do not log each request")
    serve.set_defaults(run=cmd_serve, long_running=True)
