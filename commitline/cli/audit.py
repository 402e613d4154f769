"""``commitline audit ...``: history, state at a version or time, diff, and chain verification.

Questions about one aggregate are asked as a tenant (``--tenant/-t``, default ``default``, as for
``dispatch``): another tenant's aggregate is not found. ``verify --all`` checks every tenant's streams;
every finished verification is recorded (``Commitline.verify_chains``) for the status page."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from commitline.application.errors import CommitlineError
from commitline.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    actions,
    aggregate_id,
    console,
    error_exit,
    print_json,
    timestamp,
)


def _json_value(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def cmd_audit(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.table import Table

    from commitline.cli.common import bootstrap

    with bootstrap(create_store=False) as app:
        auditor = app.auditor()
        try:
            if args.audit_command == "verify":
                return _verify(app, args)
            if args.audit_command == "history":
                history = auditor.history(args.aggregate_id, compact=not args.json, tenant=args.tenant)
                if args.json:
                    print_json(asdict(history), sys.stdout)
                    return EXIT_OK
                table = Table(title=f"{history.aggregate_type} {history.aggregate_id} (tenant {history.tenant})")
                for column in ("version", "recorded at", "type", "payload", "transition", "state after"):
                    table.add_column(column)
                for e in history.entries:
                    table.add_row(str(e.version), e.recorded_at.isoformat(), e.type, _json_value(e.payload),
                                  e.transition or "", _json_value(e.state_after))
                console().print(table)
                return EXIT_OK
            if args.audit_command == "state":
                state = (auditor.state_at_version(args.aggregate_id, args.at_version, tenant=args.tenant)
                         if args.at_version is not None
                         else auditor.state_as_of(args.aggregate_id, args.as_of, tenant=args.tenant))
                print_json(asdict(state), sys.stdout)
                return EXIT_OK
            diff = auditor.diff(args.aggregate_id, args.from_version, args.to_version, tenant=args.tenant)
            print_json({"aggregate_id": diff.aggregate_id, "aggregate_type": diff.aggregate_type,
                         "from_version": diff.from_version, "to_version": diff.to_version,
                         "changed": {k: {"from": a, "to": b} for k, (a, b) in diff.changed.items()},
                         "events": [asdict(e) for e in diff.events]}, sys.stdout)
            return EXIT_OK
        except CommitlineError as e:
            return error_exit(e, EXIT_USAGE)


def _verify(app, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from commitline.cli.progress import progress_reporter

    if args.aggregate is None and not args.all:
        print("audit verify: name --aggregate ID or --all", file=sys.stderr)
        return EXIT_USAGE
    with progress_reporter("verify") as progress:  # the run is recorded for the status page
        report = app.verify_chains(args.aggregate, tenant=args.tenant,
                                   progress=progress if args.aggregate is None else None)
    rate = report.events / report.seconds if report.seconds else 0
    if args.json:
        print_json(report.document(), sys.stdout)
    else:
        for v in report.broken:
            owner = f" (tenant {v.tenant})" if v.tenant is not None else ""
            print(f"BROKEN {v.aggregate_id}{owner}: {v.problem} at version {v.version}: {v.detail}")
        verdict = "OK" if report.ok else f"{len(report.broken)} stream(s) BROKEN"
        print(f"{verdict}: {report.streams} streams, {report.events} events verified in {_took(report.seconds)} "
              f"({rate:,.0f} events/s)")
    return EXIT_OK if report.ok else EXIT_REFUSED


def _took(seconds: float) -> str:
    """A duration as a person reads it: milliseconds below a second (a small store's "0.0 s" says nothing)."""
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    asub = actions(sub, "audit", "forensics: history, state at a version or time, diff, verify the chain")
    averify = asub.add_parser("verify", help="re-derive the hash chains; exit 1 when anything is broken",
                              description="Reports per stream OK or the first event whose content or link does not "
                              "match. Removing a stream's last events leaves a valid chain; that is detected with "
                              "the idempotency records, which keep the version each command produced.")
    scope = averify.add_mutually_exclusive_group()
    scope.add_argument("--aggregate", type=aggregate_id, metavar="ID", help="verify one stream")
    scope.add_argument("--all", action="store_true", help="verify every stream (with progress)")
    averify.add_argument("--json", action="store_true", help="machine-readable report")
    ahistory = asub.add_parser("history", help="every event of an aggregate with its transition and the state after")
    ahistory.add_argument("aggregate_id", type=aggregate_id, metavar="ID", help="the aggregate (its stream's id)")
    ahistory.add_argument("--json", action="store_true", help="machine-readable, with full states")
    astate = asub.add_parser("state", help="the aggregate's state at a version or as of a time (replayed)")
    astate.add_argument("aggregate_id", type=aggregate_id, metavar="ID", help="the aggregate (its stream's id)")
    when = astate.add_mutually_exclusive_group(required=True)
    when.add_argument("--at-version", type=int, metavar="N", help="the state after its Nth event (0: before the first)")
    when.add_argument("--as-of", type=timestamp, metavar="TIMESTAMP", help="ISO 8601 with offset")
    adiff = asub.add_parser("diff", help="what changed between two versions")
    adiff.add_argument("aggregate_id", type=aggregate_id, metavar="ID", help="the aggregate (its stream's id)")
    adiff.add_argument("--from", dest="from_version", type=int, required=True, metavar="N",
                       help="the version compared from (0: before the first event)")
    adiff.add_argument("--to", dest="to_version", type=int, required=True, metavar="M",
                       help="the version compared to, after N")
    for parser_ in (astate, adiff):  # they always print JSON; the flag is accepted like everywhere else
        parser_.add_argument("--json", action="store_true", help="accepted for uniformity: the output is always JSON")
    for parser_ in (averify, ahistory, astate, adiff):
        parser_.add_argument("--tenant", "-t", default="default",
                             help="the tenant asking; another tenant's aggregate is not found (default: default)"
                             + ("; --all covers every tenant" if parser_ is averify else ""))
        parser_.set_defaults(run=cmd_audit)
