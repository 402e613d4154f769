"""``commitline dispatch``: apply commands given as a JSON argument or JSON lines on stdin.

Stdin lines go to ``CommandProcessor.dispatch_many`` in chunks (whatever has been read, at most
``CHUNK``), so independent lines share group commits; results are printed in line order, as if the lines
were applied one by one.

A stdin line's idempotency key never depends on where the line is: an envelope carries its own key,
and a plain command line's key is derived from its content (``derived_key``), so running the same
input again, with lines added, moved or repeated, never applies a command twice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from commitline.application.boundary import (
    MAX_KEY_LENGTH,
    CommandLimits,
    check_idempotency_key,
    idempotency_key_or_none,
    problem,
    read_json,
)
from commitline.application.errors import (
    CommitlineError,
    InvalidCommand,
    InvalidIdempotencyKey,
    MissingIdempotencyKey,
    StoreUnavailable,
    UnknownCommandType,
)
from commitline.application.ports import IdempotencyRecordBroken
from commitline.cli.common import (
    APP_SPEC,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    actions,
    error_exit,
    print_json,
)


ENVELOPE = ("command", "idempotency_key", "tenant")
DERIVED_PREFIX = "sha256:"
DERIVED_LENGTH = len(DERIVED_PREFIX) + 64
MAX_NAMESPACE_LENGTH = MAX_KEY_LENGTH - DERIVED_LENGTH - 1  # room for "K:" in front of the derived key
CHUNK = 256  # stdin lines handed to ``dispatch_many`` at once (concurrent ones share group commits)


#: What ``dispatch`` prints on stderr (after the traceback, logged) when a command fails with an unexpected exception.
INTERNAL_ERROR = {"error": "InternalError", "code": "internal_error", "details": {},
                  "message": "internal error (the traceback above); nothing was written: a retry with the same "
                             "idempotency key answers either way"}


def broken_record(error: IdempotencyRecordBroken) -> dict[str, Any]:
    """What ``dispatch`` prints on stderr for a key whose record cannot be replayed: a fault of the store (exit 3),
    which no retry mends, named without a traceback."""
    return {"error": "IdempotencyRecordBroken", "code": "idempotency_record_broken",
            "details": {"tenant": error.tenant, "idempotency_key": error.key, "reason": error.reason},
            "message": f"{error}; nothing was written, and a retry with this key answers the same: "
                       "`commitline audit verify --all` names the damaged stream"}


def canonical_json(value: Any) -> bytes:
    """``value`` as JSON with sorted keys and no whitespace: the same command written differently
    (key order, spacing) gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8", "surrogatepass")


def derived_key(command: Any, tenant: str, namespace: str | None = None) -> str:
    """The idempotency key of a plain stdin line: ``sha256:`` + hex SHA-256 over the tenant and the
    command's canonical JSON, after ``namespace:`` when one is given (``-k``)."""
    digest = hashlib.sha256(tenant.encode("utf-8", "surrogatepass") + b"\x00" + canonical_json(command)).hexdigest()
    key = DERIVED_PREFIX + digest
    return f"{namespace}:{key}" if namespace is not None else key


def check_namespace(namespace: str) -> str:
    """``-k`` given with stdin input: usable as a key itself and short enough to prefix a derived key; returned as
    a key is stored (without surrounding white space)."""
    namespace = check_idempotency_key(namespace, "dispatch (stdin)")
    if len(namespace) > MAX_NAMESPACE_LENGTH:
        raise InvalidIdempotencyKey("dispatch (stdin)", f"with stdin input -k is a namespace of at most "
                                    f"{MAX_NAMESPACE_LENGTH} characters (it prefixes each line's derived key), "
                                    f"not {len(namespace)}")
    return namespace


def _lines(stream: BinaryIO, limit: int) -> Iterator[bytes]:
    """The lines of ``stream``; one longer than ``limit`` bytes is cut after ``limit + 1`` (the rest skipped)."""
    while line := stream.readline(limit + 1):
        if len(line) > limit and not line.endswith(b"\n"):
            while (rest := stream.readline(limit + 1)) and not rest.endswith(b"\n"):
                pass
        yield line.rstrip(b"\r\n")


_Request = tuple[int, Any, Any, Any]  # line number, command (or the line's error), idempotency key, tenant


def _stdin_requests(namespace: str | None, tenant: str, stream: BinaryIO,
                    limits: CommandLimits) -> Iterator[_Request]:
    """Each non-blank line is a command (its key is ``derived_key``), or an envelope {"command",
    "idempotency_key", "tenant"} (its own key): a line with no ``type`` whose ``command`` is an object. Lines are bytes checked by the boundary, so invalid UTF-8
    or JSON, or a line too long, is that line's error. The line number is only for the operator."""
    for number, line in enumerate(_lines(stream, limits.max_bytes), start=1):
        if not line.strip():
            continue
        try:
            data = read_json(line, limits)
            # a command names its type; a line that does not but holds a "command" object is an envelope (so a
            # command may have a field called command)
            envelope = isinstance(data, dict) and "type" not in data and isinstance(data.get("command"), dict)
            if envelope and (extra := sorted(data.keys() - set(ENVELOPE))):
                raise InvalidCommand(None, [problem([key], f"an envelope has only {', '.join(ENVELOPE)}",
                                                    "extra_forbidden") for key in extra])
        except InvalidCommand as e:
            yield number, e, None, tenant
            continue
        if envelope:
            yield number, data["command"], data.get("idempotency_key"), data.get("tenant", tenant)
        else:
            yield number, data, derived_key(data, tenant, namespace), tenant


def _chunks(requests: Iterator[_Request], size: int) -> Iterator[list[_Request]]:
    """The requests in lists of at most ``size``: the lines already read, never waiting for more (a
    reader thread reads ahead), so a caller that writes a line and waits for its answer gets it."""
    ready: queue.Queue[_Request | None] = queue.Queue(maxsize=size)
    failed: list[BaseException] = []

    def read() -> None:
        try:
            for request in requests:
                ready.put(request)
        except BaseException as e:  # raised here, in the caller's thread, after the lines before it
            failed.append(e)
        finally:
            ready.put(None)

    threading.Thread(target=read, name="dispatch-stdin", daemon=True).start()
    while (first := ready.get()) is not None:
        chunk = [first]
        while len(chunk) < size:
            try:
                request = ready.get_nowait()
            except queue.Empty:
                break
            if request is None:
                yield chunk
                _reraise(failed)
                return
            chunk.append(request)
        yield chunk
    _reraise(failed)


def _reraise(failed: list[BaseException]) -> None:
    if failed:
        raise failed[0]


def _said_for_the_command_line(error: CommitlineError) -> CommitlineError:
    """``error`` as the command line says it: a missing key (not an invalid one) names the flag that gives one."""
    if type(error) is MissingIdempotencyKey:  # InvalidIdempotencyKey is a kind of it: its reason is its own
        return MissingIdempotencyKey(error.command_type, f"{error.reason}: give one with -k KEY (--idempotency-key)")
    return error


def cmd_dispatch(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    if args.command is None and sys.stdin.isatty():
        print("dispatch: give a command as JSON, or JSON lines on stdin", file=sys.stderr)
        return EXIT_USAGE
    namespace = args.idempotency_key
    if args.command is None and namespace is not None:
        try:
            namespace = check_namespace(namespace)
        except InvalidIdempotencyKey as e:
            return error_exit(e, EXIT_USAGE)
    with bootstrap(dispatch_cpu="auto") as app:
        if args.command is not None:
            try:
                result = app.dispatch(args.command, idempotency_key=args.idempotency_key, tenant=args.tenant)
            except CommitlineError as e:
                said = _said_for_the_command_line(e)
                if isinstance(e, UnknownCommandType) and APP_SPEC[0] is None and not os.environ.get("COMMITLINE_APP"):
                    print_json({**said.to_dict(), "hint": f"the domain in use is the built-in examples "
                                f"({app.domain.name}): give your own with --app module:attribute or COMMITLINE_APP"},
                               sys.stderr)  # still one JSON document: stderr holds only the error
                    return EXIT_REFUSED
                return error_exit(said, EXIT_REFUSED)
            except IdempotencyRecordBroken as e:
                print_json(broken_record(e), sys.stderr)
                return EXIT_UNAVAILABLE
            except Exception:  # a defect of the domain's code (a handler's TypeError): refused as HTTP's 500 is
                logging.getLogger("commitline.dispatch").exception("the command failed unexpectedly")
                print_json(INTERNAL_ERROR, sys.stderr)
                return EXIT_REFUSED
            print_json(result.model_dump(mode="json"), sys.stdout)
            return EXIT_OK
        failures = 0
        requests = _stdin_requests(namespace, args.tenant, sys.stdin.buffer, app.processor.limits)
        for chunk in _chunks(requests, CHUNK):
            try:
                outcomes = iter(app.processor.dispatch_many(
                    [(command, key, tenant) for _, command, key, tenant in chunk
                     if not isinstance(command, CommitlineError)]))
            except IdempotencyRecordBroken as e:  # the chunk's other lines: run them again, same keys
                line = next((n for n, _, key, tenant in chunk if (key, tenant) == (e.key, e.tenant)), None)
                print_json({"line": line, "idempotency_key": e.key, **broken_record(e)}, sys.stderr)
                return EXIT_UNAVAILABLE
            for number, command, key, tenant in chunk:
                stored = idempotency_key_or_none(key)
                where = {"line": number, "idempotency_key": stored} if stored is not None else {"line": number}
                outcome = command if isinstance(command, CommitlineError) else next(outcomes)
                if isinstance(outcome, StoreUnavailable):  # the lines after it: run them again, same keys
                    print_json({**where, **outcome.to_dict()}, sys.stderr)
                    return EXIT_UNAVAILABLE
                if isinstance(outcome, CommitlineError):
                    failures += 1
                    print_json({**where, **outcome.to_dict()}, sys.stderr)
                else:
                    print_json({**where, "replayed": outcome.replayed, "result": outcome.model_dump(mode="json")},
                               sys.stdout)
        return EXIT_REFUSED if failures else EXIT_OK


MAX_RETENTION_DAYS = 365_000  # a thousand years


def cmd_expire(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from commitline.cli.common import bootstrap

    if not 1 <= args.older_than_days <= MAX_RETENTION_DAYS:  # beyond: before any date PostgreSQL can hold
        print(f"idempotency expire: --older-than-days must be between 1 and {MAX_RETENTION_DAYS}", file=sys.stderr)
        return EXIT_USAGE
    with bootstrap(create_store=False) as app:
        count = app.expire_idempotency_records(timedelta(days=args.older_than_days), dry_run=args.dry_run)
    if args.json:
        print_json({"would_delete" if args.dry_run else "deleted": count, "older_than_days": args.older_than_days})
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {count} idempotency records older than {args.older_than_days} days")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dispatch = sub.add_parser(
        "dispatch",
        usage="commitline dispatch [-t TENANT] -k KEY COMMAND_JSON\n"
              "       commitline dispatch [-t TENANT] [-k NAMESPACE] < json-lines",
        help="validate and apply one command (JSON argument) or many (JSON lines on stdin)",
        description="Apply commands exactly once. The result is printed as JSON on stdout; a refused command "
        "prints its typed error as JSON on stderr and exits 1. On stdin, each line is an envelope "
        "{\"command\": {...}, \"idempotency_key\": \"...\", \"tenant\": \"...\"}, which uses its own key, or a "
        "plain command, whose key is derived from its content: sha256:<hex of SHA-256 over the tenant and the "
        "command's JSON with sorted keys and no whitespace>, never from its line number. Running the same input "
        "again (blank lines added, lines moved or repeated) never applies a command twice: a repeated line is "
        "reported \"replayed\": true. So two intentionally identical commands in one input need envelope lines "
        "with distinct keys. Each stdin result or error is printed with its line number and the key used.",
    )
    dispatch.add_argument("command", nargs="?", help='the command as JSON, e.g. \'{"type": "<command type>", ...}\'')
    dispatch.add_argument("--idempotency-key", "-k", metavar="KEY",
                          help="required with a JSON argument: the command's key (1-255 printable ASCII "
                          "characters); retrying with the same key never applies "
                          "it twice. With stdin: a namespace, each plain line's key becoming KEY:sha256:<hex>, "
                          f"so the same input can deliberately be applied again under a new namespace (at most "
                          f"{MAX_NAMESPACE_LENGTH} characters; envelope keys are used as given)")
    dispatch.add_argument("--tenant", "-t", default="default", help="tenant the key belongs to (default: default)")
    dispatch.set_defaults(run=cmd_dispatch)

    isub = actions(sub, "idempotency", "the idempotency retention job")
    expire = isub.add_parser("expire", help="delete idempotency records older than the retention period",
                             description="Records are kept until this job removes them. Choose a period longer "
                             "than any client's retry window: a retry after its record expired is a new command.")
    expire.add_argument("--older-than-days", type=int, required=True, metavar="DAYS",
                        help="delete the records older than DAYS days (1 or more)")
    expire.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    expire.add_argument("--json", action="store_true", help="machine-readable output")
    expire.set_defaults(run=cmd_expire)
