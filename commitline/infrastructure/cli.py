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
from datetime import datetime
from typing import Any, TextIO
from uuid import UUID, uuid4

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
    from commitline.infrastructure.status import follower_statuses, status_table, stuck_fulfilments

    with bootstrap() as app:
        head, statuses = follower_statuses(app.recorder)
        stuck = stuck_fulfilments(app.datastore)
    if args.json:
        _print_json({"head": head, "followers": [s.as_dict() for s in statuses],
                     "stuck_fulfilments": [str(r.order_id) for r in stuck]}, sys.stdout)
        return EXIT_OK
    table = status_table(head, statuses)
    console = Console()
    if not console.is_terminal:  # piped: never truncate a column
        console = Console(width=200)
    console.print(table)
    if not statuses:
        console.print("no follower has run yet")
    if stuck:
        console.print(f"[red]{len(stuck)} order fulfilment(s) STUCK, needing manual intervention[/red] "
                      "(commitline sagas list --stuck)")
    return EXIT_OK


def _projection_names(names: list[str]) -> list[str]:
    from commitline.projections import PROJECTIONS

    unknown = [n for n in names if n not in PROJECTIONS]
    if unknown:
        raise SystemExit(f"unknown projection(s) {', '.join(unknown)}; known: {', '.join(sorted(PROJECTIONS))}")
    return names or sorted(PROJECTIONS)


def cmd_project(args: argparse.Namespace) -> int:
    from commitline.infrastructure.bootstrap import bootstrap
    from commitline.projections import PROJECTIONS
    from commitline.projections.projector import Projector

    names = _projection_names(args.names)

    async def project() -> None:
        with bootstrap() as app:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            projectors = [Projector(PROJECTIONS[n](), app.recorder, app.conninfo,
                                    batch_size=app.settings.project_batch_size) for n in names]
            await asyncio.gather(*(p.run(stop) for p in projectors))

    asyncio.run(project())
    return EXIT_OK


def cmd_projections_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from commitline.infrastructure.bootstrap import bootstrap
    from commitline.infrastructure.status import follower_statuses
    from commitline.projections import PROJECTIONS

    with bootstrap() as app:
        head, statuses = follower_statuses(app.recorder)
    by_name = {s.name: s for s in statuses}
    rows = []
    for name in sorted(PROJECTIONS):
        s = by_name.get(name)
        rebuilding = by_name.get(f"{name}@rebuild")
        rows.append({
            "name": name, "status": s.status if s else "never run", "position": s.position if s else 0,
            "lag_events": s.lag_events if s else head, "lag_seconds": s.lag_seconds if s else None,
            "error": s.error if s else None,
            "rebuild_position": rebuilding.position if rebuilding else None,
            "tables": [t.name for t in PROJECTIONS[name].tables],
        })
    if args.json:
        _print_json({"head": head, "projections": rows}, sys.stdout)
        return EXIT_OK
    table = Table(title=f"projections (log head {head})")
    for column in ("projection", "status", "position", "lag (events)", "rebuild at", "error", "tables"):
        table.add_column(column)
    for r in rows:
        error = f"{r['error']['message']} at {r['error']['position']}" if r["error"] else ""
        table.add_row(r["name"], r["status"], str(r["position"]), str(r["lag_events"]),
                      "" if r["rebuild_position"] is None else str(r["rebuild_position"]), error, ", ".join(r["tables"]))
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)
    return EXIT_OK


def cmd_projections_rebuild(args: argparse.Namespace) -> int:
    from commitline.infrastructure.bootstrap import bootstrap
    from commitline.infrastructure.progress import progress_reporter
    from commitline.projections import PROJECTIONS
    from commitline.projections.rebuild import RebuildError, rebuild

    (name,) = _projection_names([args.name])
    with bootstrap() as app, progress_reporter(f"rebuild {name}") as progress:
        try:
            result = rebuild(PROJECTIONS[name](), app.recorder, app.conninfo,
                             batch_size=app.settings.project_batch_size, progress=progress)
        except RebuildError as e:
            print(f"rebuild of {name} failed: {e}", file=sys.stderr)
            return EXIT_REFUSED
        except KeyboardInterrupt:
            print(f"rebuild of {name} interrupted; the live view is untouched. Run it again to resume.",
                  file=sys.stderr)
            return 130
    rate = result.events_applied / result.seconds if result.seconds else 0
    resumed = f", resumed from position {result.resumed_from}" if result.resumed_from else ""
    print(f"rebuilt {name}: position {result.position}, {result.events_applied} events in {result.seconds:.1f} s "
          f"({rate:,.0f} events/s){resumed}; swapped in atomically")
    return EXIT_OK


def cmd_projections_intervene(args: argparse.Namespace) -> int:
    from commitline.infrastructure.bootstrap import bootstrap
    from commitline.projections.interventions import InterventionRefused, retry, skip

    (name,) = _projection_names([args.name])
    with bootstrap() as app:
        try:
            if args.action == "skip":
                message = skip(app.datastore, name, args.position, args.reason)
            else:
                message = retry(app.datastore, name)
        except InterventionRefused as e:
            print(str(e), file=sys.stderr)
            return EXIT_REFUSED
    print(message)
    return EXIT_OK


def _auditor(app):  # type: ignore[no-untyped-def]
    from commitline.application.audit import Auditor
    from commitline.domain import AGGREGATE_TYPES
    from commitline.infrastructure.audit_source import PostgresAuditSource

    return Auditor(PostgresAuditSource(app.recorder), AGGREGATE_TYPES)


def _json_value(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def cmd_audit(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.console import Console
    from rich.table import Table

    from commitline.infrastructure.bootstrap import bootstrap

    with bootstrap() as app:
        auditor = _auditor(app)
        try:
            if args.audit_command == "verify":
                return _verify(auditor, args)
            if args.audit_command == "history":
                history = auditor.history(args.aggregate_id, compact=not args.json)
                if args.json:
                    _print_json(asdict(history), sys.stdout)
                    return EXIT_OK
                table = Table(title=f"{history.aggregate_type} {history.aggregate_id} (tenant {history.tenant})")
                for column in ("version", "recorded at", "type", "payload", "transition", "state after"):
                    table.add_column(column)
                for e in history.entries:
                    table.add_row(str(e.version), e.recorded_at.isoformat(), e.type, _json_value(e.payload),
                                  e.transition or "", _json_value(e.state_after))
                console = Console()
                if not console.is_terminal:
                    console = Console(width=200)
                console.print(table)
                return EXIT_OK
            if args.audit_command == "state":
                state = (auditor.state_at_version(args.aggregate_id, args.at_version) if args.at_version is not None
                         else auditor.state_as_of(args.aggregate_id, args.as_of))
                _print_json(asdict(state), sys.stdout)
                return EXIT_OK
            diff = auditor.diff(args.aggregate_id, args.from_version, args.to_version)
            _print_json({"aggregate_id": diff.aggregate_id, "aggregate_type": diff.aggregate_type,
                         "from_version": diff.from_version, "to_version": diff.to_version,
                         "changed": {k: {"from": a, "to": b} for k, (a, b) in diff.changed.items()},
                         "events": [asdict(e) for e in diff.events]}, sys.stdout)
            return EXIT_OK
        except CommitlineError as e:
            _print_json(_error(e), sys.stderr)
            return EXIT_USAGE


def _verify(auditor, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from commitline.infrastructure.progress import progress_reporter

    if args.aggregate is None and not args.all:
        print("audit verify: name --aggregate ID or --all", file=sys.stderr)
        return EXIT_USAGE
    with progress_reporter("verify") as progress:
        report = auditor.verify(args.aggregate, progress=progress if args.aggregate is None else None)
    rate = report.events / report.seconds if report.seconds else 0
    summary = {"ok": report.ok, "streams": report.streams, "events": report.events,
               "seconds": round(report.seconds, 3), "broken": [
                   {"aggregate_id": str(v.aggregate_id), "problem": v.problem, "version": v.version,
                    "detail": v.detail} for v in report.broken]}
    if args.json:
        _print_json(summary, sys.stdout)
    else:
        for v in report.broken:
            print(f"BROKEN {v.aggregate_id}: {v.problem} at version {v.version}: {v.detail}")
        verdict = "OK" if report.ok else f"{len(report.broken)} stream(s) BROKEN"
        print(f"{verdict}: {report.streams} streams, {report.events} events verified in {report.seconds:.1f} s "
              f"({rate:,.0f} events/s)")
    return EXIT_OK if report.ok else EXIT_REFUSED


def _aggregate_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an aggregate id (a UUID)") from None


def _timestamp(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time, e.g. 2026-11-21T05:42:00+00:00") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset; add one, e.g. +00:00")
    return moment


def cmd_sagas(args: argparse.Namespace) -> int:
    from commitline.infrastructure.bootstrap import bootstrap

    if args.sagas_command == "run":
        return _run_sagas()
    with bootstrap() as app:
        if args.sagas_command == "list":
            from commitline.projections import ReadModels

            rows = ReadModels(app.datastore).fulfilments(stuck_only=args.stuck)
            if args.json:
                _print_json([r.__dict__ for r in rows], sys.stdout)
            else:
                for r in rows:
                    print(f"{r.order_id}  {r.state:<12} {r.stuck or r.failure}")
                print(f"{len(rows)} saga(s){' stuck' if args.stuck else ''}", file=sys.stderr)
            return EXIT_OK
        from commitline.domain.order import fulfilment_id

        if args.sagas_command == "retry":
            from commitline.application.commands import RetryFulfilment

            try:
                result = app.processor.dispatch(RetryFulfilment(order_id=args.order_id),
                                                idempotency_key=f"operator-retry/{args.order_id}/{uuid4()}")
            except CommitlineError as e:
                _print_json(_error(e), sys.stderr)
                return EXIT_REFUSED
            print(f"fulfilment of {args.order_id} set back to COMPENSATING (version {result.version}); "
                  "the running process manager picks it up")
            return EXIT_OK
        try:
            history = _auditor(app).history(fulfilment_id(args.order_id))
        except CommitlineError as e:
            _print_json(_error(e), sys.stderr)
            return EXIT_USAGE
        if args.json:
            _print_json([{"version": e.version, "at": e.recorded_at, "type": e.type, "payload": e.payload,
                          "state": e.transition} for e in history.entries], sys.stdout)
            return EXIT_OK
        for e in history.entries:
            outcome = ", ".join(f"{k}={v}" for k, v in e.payload.items() if k != "order_id")
            print(f"{e.version:>3}  {e.recorded_at:%H:%M:%S.%f}  {e.type:<24} {outcome:<60} {e.transition or ''}")
        return EXIT_OK


def _run_sagas() -> int:
    from commitline.application.fulfilment import FulfilmentSaga
    from commitline.infrastructure.bootstrap import bootstrap
    from commitline.infrastructure.fulfilment_runner import FulfilmentRunner
    from commitline.infrastructure.simulated_gateway import SimulatedGateway
    from commitline.projections import PROJECTIONS
    from commitline.projections.projector import Projector

    async def run() -> None:
        with bootstrap() as app:
            logging.getLogger(__name__).warning(
                "payments go through the SIMULATED gateway (commitline ships no real one; implement "
                "commitline.application.payment_gateway.PaymentGateway for production)")
            gateway = SimulatedGateway(app.conninfo, app.settings.schema_name)
            saga = FulfilmentSaga(app.processor, app.store, gateway)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            runner = FulfilmentRunner(saga, app.recorder, app.conninfo)
            projector = Projector(PROJECTIONS["order_fulfilments"](), app.recorder, app.conninfo)
            await asyncio.gather(runner.run(stop), projector.run(stop))

    asyncio.run(run())
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

    project = sub.add_parser("project", help="keep read models up to date until SIGINT/SIGTERM",
                             description="Run the projector of each named projection (default: all). Each applies "
                             "batches of events and its position in one transaction; one instance per projection "
                             "works at a time (advisory lock), others wait.")
    project.add_argument("names", nargs="*", metavar="NAME", help="projections to run (default: all)")
    project.set_defaults(run=cmd_project)

    projections = sub.add_parser("projections", help="list, rebuild, skip a poison event, or retry a projection")
    psub = projections.add_subparsers(dest="projections_command", required=True, metavar="ACTION")
    plist = psub.add_parser("list", help="projections with their position, lag and status")
    plist.add_argument("--json", action="store_true", help="machine-readable output")
    plist.set_defaults(run=cmd_projections_list)
    prebuild = psub.add_parser("rebuild", help="rebuild from the first event into fresh tables, then swap atomically",
                               description="Readers keep the old complete view until the rebuilt one replaces it "
                               "in one transaction. Interrupt it and run it again to resume.")
    prebuild.add_argument("name", metavar="NAME")
    prebuild.set_defaults(run=cmd_projections_rebuild)
    pskip = psub.add_parser("skip", help="pass over the poison event a projection stopped at (explicit, logged)")
    pskip.add_argument("name", metavar="NAME")
    pskip.add_argument("--position", type=int, required=True, help="the poison event's position, as status shows it")
    pskip.add_argument("--reason", default="", help="why it is safe to skip it (kept in the intervention log)")
    pskip.set_defaults(run=cmd_projections_intervene, action="skip")
    pretry = psub.add_parser("retry", help="let a projection stopped at a poison event try it again")
    pretry.add_argument("name", metavar="NAME")
    pretry.set_defaults(run=cmd_projections_intervene, action="retry")

    audit = sub.add_parser("audit", help="forensics: history, state at a version or time, diff, verify the chain")
    asub = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    averify = asub.add_parser("verify", help="re-derive the hash chains; exit 1 when anything is broken",
                              description="Reports per stream OK or the first event whose content or link does not "
                              "match. Removing a stream's last events leaves a valid chain; that is detected with "
                              "the idempotency records, which keep the version each command produced.")
    averify.add_argument("--aggregate", type=_aggregate_id, metavar="ID", help="verify one stream")
    averify.add_argument("--all", action="store_true", help="verify every stream (with progress)")
    averify.add_argument("--json", action="store_true", help="machine-readable report")
    ahistory = asub.add_parser("history", help="every event of an aggregate with its transition and the state after")
    ahistory.add_argument("aggregate_id", type=_aggregate_id, metavar="ID")
    ahistory.add_argument("--json", action="store_true", help="machine-readable, with full states")
    astate = asub.add_parser("state", help="the aggregate's state at a version or as of a time (replayed)")
    astate.add_argument("aggregate_id", type=_aggregate_id, metavar="ID")
    when = astate.add_mutually_exclusive_group(required=True)
    when.add_argument("--at-version", type=int, metavar="N")
    when.add_argument("--as-of", type=_timestamp, metavar="TIMESTAMP", help="ISO 8601 with offset")
    adiff = asub.add_parser("diff", help="what changed between two versions")
    adiff.add_argument("aggregate_id", type=_aggregate_id, metavar="ID")
    adiff.add_argument("--from", dest="from_version", type=int, required=True, metavar="N")
    adiff.add_argument("--to", dest="to_version", type=int, required=True, metavar="M")
    for parser_ in (averify, ahistory, astate, adiff):
        parser_.set_defaults(run=cmd_audit)

    sagas = sub.add_parser("sagas", help="order fulfilment: run the process manager, show, list, retry")
    ssub = sagas.add_subparsers(dest="sagas_command", required=True, metavar="ACTION")
    ssub.add_parser("run", help="run the order-fulfilment process manager until SIGINT/SIGTERM",
                    description="Advances every placed order: reserve stock -> authorize payment -> confirm and "
                    "capture; compensates in reverse on failure. One instance at a time (advisory lock).")
    sshow = ssub.add_parser("show", help="the steps a fulfilment took and their outcomes")
    sshow.add_argument("order_id", type=_aggregate_id, metavar="ORDER_ID")
    sshow.add_argument("--json", action="store_true")
    slist = ssub.add_parser("list", help="fulfilments and their state (from the order_fulfilments read model)")
    slist.add_argument("--stuck", action="store_true", help="only those needing manual intervention")
    slist.add_argument("--json", action="store_true")
    sretry = ssub.add_parser("retry", help="retry the compensations of a STUCK fulfilment after fixing the cause")
    sretry.add_argument("order_id", type=_aggregate_id, metavar="ORDER_ID")
    sagas.set_defaults(run=cmd_sagas)

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
