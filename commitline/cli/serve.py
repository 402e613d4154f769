"""``commitline serve``: the HTTP API on uvicorn, with one or more worker processes sharing the database.

The serving process bootstraps first (schema migrated, the data folder's embedded PostgreSQL started or
reused when no database is configured), so workers start on a current schema and find the same embedded
server; it keeps that server until the last worker has stopped.
"""

from __future__ import annotations

import argparse

from commitline.cli.common import EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from commitline.composition import bootstrap
    from commitline.http.app import create_app
    from commitline.infrastructure.config import load_settings

    settings = load_settings()
    host = args.host or settings.http_host
    port = settings.http_port if args.port is None else args.port
    workers = args.workers or settings.http_workers
    options = {"host": host, "port": port, "access_log": not args.no_access_log, "log_level": "info",
               "timeout_graceful_shutdown": 30}
    with bootstrap(settings) as app:
        if workers == 1:
            uvicorn.run(create_app(app), **options)
        else:
            uvicorn.run("commitline.http.app:app_from_environment", factory=True, workers=workers, **options)
    return EXIT_OK


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
    serve.add_argument("--no-access-log", action="store_true", help="do not log each request")
    serve.set_defaults(run=cmd_serve)
