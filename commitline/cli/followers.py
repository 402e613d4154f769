"""Follower commands: ``publish``, ``status``, ``project`` and ``projections ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from commitline.cli.common import EXIT_OK, EXIT_REFUSED, console, print_json


def cmd_publish(args: argparse.Namespace) -> int:
    from commitline.bootstrap import bootstrap
    from commitline.infrastructure.kafka.publisher import KafkaPublisher

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

    from commitline.bootstrap import bootstrap
    from commitline.infrastructure.followers.status import follower_statuses, status_table

    with bootstrap() as app:
        head, statuses = follower_statuses(app.recorder)
        stuck = stuck_fulfilments(app.datastore)
    if args.json:
        print_json({"head": head, "followers": [s.as_dict() for s in statuses],
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
    from commitline.bootstrap import bootstrap
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
    from rich.table import Table

    from commitline.bootstrap import bootstrap
    from commitline.infrastructure.followers.status import follower_statuses
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
        print_json({"head": head, "projections": rows}, sys.stdout)
        return EXIT_OK
    table = Table(title=f"projections (log head {head})")
    for column in ("projection", "status", "position", "lag (events)", "rebuild at", "error", "tables"):
        table.add_column(column)
    for r in rows:
        error = f"{r['error']['message']} at {r['error']['position']}" if r["error"] else ""
        table.add_row(r["name"], r["status"], str(r["position"]), str(r["lag_events"]),
                      "" if r["rebuild_position"] is None else str(r["rebuild_position"]), error, ", ".join(r["tables"]))
    console().print(table)
    return EXIT_OK


def cmd_projections_rebuild(args: argparse.Namespace) -> int:
    from commitline.bootstrap import bootstrap
    from commitline.cli.progress import progress_reporter
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
    from commitline.bootstrap import bootstrap
    from commitline.infrastructure.followers.interventions import InterventionRefused, retry, skip

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



def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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


def stuck_fulfilments(datastore: Any) -> list[Any]:
    """Order fulfilments waiting for a person (empty when the read model was never built)."""
    from commitline.projections.queries import ReadModels
    from psycopg.rows import tuple_row

    with datastore.get_connection() as conn:
        exists = conn.cursor(row_factory=tuple_row).execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'"{datastore.schema}"."rm_order_fulfilments"',)).fetchone()[0]
    return ReadModels(datastore).fulfilments(stuck_only=True) if exists else []
