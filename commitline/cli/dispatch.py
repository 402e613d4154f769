"""``commitline dispatch``: apply commands given as a JSON argument or JSON lines on stdin."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from commitline.application.boundary import CommandLimits, problem, read_json
from commitline.application.errors import CommitlineError, InvalidCommand, StoreUnavailable
from commitline.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE, error_exit, print_json


ENVELOPE = ("command", "idempotency_key", "tenant")


def _lines(stream: BinaryIO, limit: int) -> Iterator[bytes]:
    """The lines of ``stream``; one longer than ``limit`` bytes is cut after ``limit + 1`` (the rest skipped)."""
    while line := stream.readline(limit + 1):
        if len(line) > limit and not line.endswith(b"\n"):
            while (rest := stream.readline(limit + 1)) and not rest.endswith(b"\n"):
                pass
        yield line.rstrip(b"\r\n")


def _stdin_requests(key_prefix: str | None, tenant: str, stream: BinaryIO,
                    limits: CommandLimits) -> Iterator[tuple[int, Any, str | None, str]]:
    """Each non-blank line is a command, or an envelope {"command", "idempotency_key", "tenant"}. Lines are
    bytes checked by the boundary, so invalid UTF-8 or JSON, or a line too long, is that line's error."""
    for number, line in enumerate(_lines(stream, limits.max_bytes), start=1):
        if not line.strip():
            continue
        try:
            data = read_json(line, limits)
            envelope = isinstance(data, dict) and "command" in data
            if envelope and (extra := sorted(data.keys() - set(ENVELOPE))):
                raise InvalidCommand(None, [problem([key], f"an envelope has only {', '.join(ENVELOPE)}",
                                                    "extra_forbidden") for key in extra])
        except InvalidCommand as e:
            yield number, e, None, tenant
            continue
        if envelope:
            yield number, data["command"], data.get("idempotency_key"), data.get("tenant", tenant)
        else:
            yield number, data, f"{key_prefix}:{number}" if key_prefix else None, tenant


def cmd_dispatch(args: argparse.Namespace) -> int:
    from commitline.composition import bootstrap

    if args.command is None and sys.stdin.isatty():
        print("dispatch: give a command as JSON, or JSON lines on stdin", file=sys.stderr)
        return EXIT_USAGE
    with bootstrap() as app:
        if args.command is not None:
            try:
                result = app.dispatch(args.command, idempotency_key=args.idempotency_key, tenant=args.tenant)
            except CommitlineError as e:
                return error_exit(e, EXIT_REFUSED)
            print_json(result.model_dump(mode="json"), sys.stdout)
            return EXIT_OK
        failures = 0
        for number, command, key, tenant in _stdin_requests(args.idempotency_key, args.tenant, sys.stdin.buffer,
                                                              app.processor.limits):
            try:
                if isinstance(command, CommitlineError):
                    raise command
                result = app.dispatch(command, idempotency_key=key, tenant=tenant)
                print_json({"line": number, "result": result.model_dump(mode="json")}, sys.stdout)
            except StoreUnavailable as e:  # the lines after it are not tried: run them again, same keys
                print_json({"line": number, **e.to_dict()}, sys.stderr)
                return EXIT_UNAVAILABLE
            except CommitlineError as e:
                failures += 1
                print_json({"line": number, **e.to_dict()}, sys.stderr)
        return EXIT_REFUSED if failures else EXIT_OK



def cmd_expire(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from commitline.composition import bootstrap
    from commitline.infrastructure.store.retention import expire_idempotency_records

    if args.older_than_days < 1:
        print("idempotency expire: --older-than-days must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    with bootstrap() as app:
        count = expire_idempotency_records(app.datastore, timedelta(days=args.older_than_days), dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {count} idempotency records older than {args.older_than_days} days")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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

    idempotency = sub.add_parser("idempotency", help="the idempotency retention job")
    isub = idempotency.add_subparsers(dest="idempotency_command", required=True, metavar="ACTION")
    expire = isub.add_parser("expire", help="delete idempotency records older than the retention period",
                             description="Records are kept until this job removes them. Choose a period longer "
                             "than any client's retry window: a retry after its record expired is a new command.")
    expire.add_argument("--older-than-days", type=int, required=True, metavar="DAYS")
    expire.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    expire.set_defaults(run=cmd_expire)
