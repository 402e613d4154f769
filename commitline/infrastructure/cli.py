"""The ``commitline`` console script: operator commands over the configured (or embedded) store.

Exit codes: 0 success; 1 a command was invalid or refused (typed error as JSON on stderr);
2 bad usage; 3 configuration or store unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import orjson

from commitline.application.errors import CommitlineError, ConfigurationError, InvalidCommand, StoreUnavailable

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def _print_json(value: Any, stream: TextIO) -> None:
    stream.write(orjson.dumps(value).decode() + "\n")
    stream.flush()


def _error(e: CommitlineError) -> dict[str, Any]:
    return e.to_dict()


def _stdin_requests(key_prefix: str | None, tenant: str, lines: TextIO) -> Iterator[tuple[int, Any, str | None, str]]:
    """Each non-blank line is a command, or an envelope {"command", "idempotency_key", "tenant"}."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            yield number, InvalidCommand(None, [{"loc": [], "msg": f"line {number}: not valid JSON: {e}",
                                                 "type": "json_invalid"}]), None, tenant
            continue
        if isinstance(data, dict) and "command" in data:
            yield number, data["command"], data.get("idempotency_key"), data.get("tenant", tenant)
        else:
            yield number, data, f"{key_prefix}:{number}" if key_prefix else None, tenant


def cmd_dispatch(args: argparse.Namespace) -> int:
    from commitline.infrastructure.bootstrap import bootstrap

    if args.command is None and sys.stdin.isatty():
        print("dispatch: give a command as JSON, or JSON lines on stdin", file=sys.stderr)
        return EXIT_USAGE
    with bootstrap() as app:
        if args.command is not None:
            try:
                result = app.dispatch(args.command, idempotency_key=args.idempotency_key, tenant=args.tenant)
            except CommitlineError as e:
                _print_json(_error(e), sys.stderr)
                return EXIT_REFUSED
            _print_json(result.model_dump(mode="json"), sys.stdout)
            return EXIT_OK
        failures = 0
        for number, command, key, tenant in _stdin_requests(args.idempotency_key, args.tenant, sys.stdin):
            try:
                if isinstance(command, CommitlineError):
                    raise command
                result = app.dispatch(command, idempotency_key=key, tenant=tenant)
                _print_json({"line": number, "result": result.model_dump(mode="json")}, sys.stdout)
            except CommitlineError as e:
                failures += 1
                _print_json({"line": number, **_error(e)}, sys.stderr)
        return EXIT_REFUSED if failures else EXIT_OK


def cmd_publish(args: argparse.Namespace) -> int:
    from commitline.infrastructure.bootstrap import bootstrap
    from commitline.infrastructure.publisher import KafkaPublisher

    async def publish() -> None:
        with bootstrap() as app:
            settings = app.with_kafka()
            if app.embedded_kafka is not None:
                logging.getLogger(__name__).warning(
                    "no KAFKA_BOOTSTRAP_SERVERS: publishing to an embedded in-memory broker at %s (for demos)",
                    settings.kafka_bootstrap_servers)
            publisher = KafkaPublisher(app.recorder, app.conninfo, settings)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if args.drain:
                publisher.on_caught_up = stop.set
            await publisher.run(stop)
            m = publisher.metrics
            logging.getLogger(__name__).info(
                "publisher stopped cleanly: %d events in %d batches, position %d", m.events_published, m.batches,
                m.position)

    asyncio.run(publish())
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from commitline.infrastructure.bootstrap import bootstrap
    from commitline.infrastructure.status import follower_statuses, status_table

    with bootstrap() as app:
        head, statuses = follower_statuses(app.recorder)
    if args.json:
        _print_json({"head": head, "followers": [s.as_dict() for s in statuses]}, sys.stdout)
        return EXIT_OK
    table = status_table(head, statuses)
    console = Console()
    if not console.is_terminal:  # piped: never truncate a column
        console = Console(width=200)
    console.print(table)
    if not statuses:
        console.print("no follower has run yet")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from commitline.demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commitline",
        description="Event-sourced command processor: validated, exactly-once state changes on PostgreSQL.",
        epilog="Configuration comes from environment variables (see the README). "
        "With no COMMITLINE_DATABASE_URL an embedded PostgreSQL is started in COMMITLINE_DATA_DIR.",
    )
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    dispatch = sub.add_parser(
        "dispatch",
        help="validate and apply one command (JSON argument) or many (JSON lines on stdin)",
        description="Apply commands exactly once. The result is printed as JSON on stdout; a refused command "
        "prints its typed error as JSON on stderr and exits 1. On stdin, each line is a command (its key is "
        "KEY:<line number>) or an envelope {\"command\": {...}, \"idempotency_key\": \"...\", \"tenant\": \"...\"}.",
    )
    dispatch.add_argument("command", nargs="?", help='the command as JSON, e.g. \'{"type": "submit_payment", ...}\'')
    dispatch.add_argument("--idempotency-key", "-k", help="retrying with the same key never applies it twice")
    dispatch.add_argument("--tenant", "-t", default="default", help="tenant the key belongs to (default: default)")
    dispatch.set_defaults(run=cmd_dispatch)

    publish = sub.add_parser(
        "publish",
        help="publish every stored event to Kafka in commit order until SIGINT/SIGTERM",
        description="Follow the notification log and publish each event (topic per aggregate type, key = aggregate "
        "id, acks=all). Only one instance publishes at a time (PostgreSQL advisory lock); others wait and take "
        "over when it dies. The position is saved only after the broker acknowledged everything up to it.",
    )
    publish.add_argument("--drain", action="store_true", help="exit once everything stored so far is published")
    publish.set_defaults(run=cmd_publish)

    status = sub.add_parser("status", help="show each follower's position, the log head and the lag")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(run=cmd_status)

    demo = sub.add_parser("demo", help="run the scripted demonstration workload and print a summary")
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return int(args.run(args))
    except (ConfigurationError, StoreUnavailable) as e:
        _print_json(_error(e), sys.stderr)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
