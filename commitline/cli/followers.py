"""Follower commands: ``publish``, ``publisher ...``, ``status``, ``project`` and ``projections ...``."""

from __future__ import annotations

import argparse
import logging
import sys

from rich.table import Table

from commitline.cli.common import EXIT_OK, EXIT_REFUSED, console, print_json
from commitline.infrastructure.followers.status import FollowerStatus

log = logging.getLogger(__name__)


def cmd_publish(args: argparse.Namespace) -> int:
    from commitline.composition import bootstrap

    with bootstrap() as app:
        publisher = app.publisher()
        if app.embedded_kafka is not None:
            log.warning("no KAFKA_BOOTSTRAP_SERVERS: publishing to an embedded in-memory broker at %s (for demos)",
                        app.embedded_kafka.bootstrap_servers)
        app.run_until_signalled(publisher, drain=args.drain)
        m = publisher.metrics
        if publisher.waiting_for_operator:
            log.error("publisher stopped at a poison record after position %d (%d events published); "
                      "see `commitline status`, then `commitline publisher retry` or `skip`", m.position,
                      m.events_published)
            return EXIT_REFUSED
        log.info("publisher stopped cleanly: %d events in %d batches, position %d", m.events_published, m.batches,
                 m.position)
    return EXIT_OK


def status_table(head: int, statuses: list[FollowerStatus]) -> Table:
    table = Table(title=f"commitline followers (log head {head})")
    for column in ("follower", "status", "owner", "position", "lag (events)", "lag (s)", "updated", "error"):
        table.add_column(column)
    for s in statuses:
        error = f"{s.error.get('message', '')} at {s.error.get('position', '?')}" if s.error else ""
        table.add_row(s.name, s.status, s.owner or "", str(s.position), str(s.lag_events), f"{s.lag_seconds:.1f}",
                      s.updated_at.strftime("%Y-%m-%d %H:%M:%S"), error)
    return table


def cmd_status(args: argparse.Namespace) -> int:
    from commitline.composition import bootstrap

    with bootstrap() as app:
        report = app.status()
    if args.json:
        print_json({"head": report.head, "followers": [s.as_dict() for s in report.followers],
                    "stuck_fulfilments": [str(r.order_id) for r in report.stuck_fulfilments]}, sys.stdout)
        return EXIT_OK
    out = console()
    out.print(status_table(report.head, report.followers))
    if not report.followers:
        out.print("no follower has run yet")
    if report.stuck_fulfilments:
        out.print(f"[red]{len(report.stuck_fulfilments)} order fulfilment(s) STUCK, needing manual intervention"
                  "[/red] (commitline sagas list --stuck)")
    return EXIT_OK


def cmd_project(args: argparse.Namespace) -> int:
    from commitline.composition import bootstrap

    with bootstrap() as app:
        app.run_until_signalled(*app.projectors(args.names))
    return EXIT_OK


def cmd_projections_list(args: argparse.Namespace) -> int:
    from commitline.composition import bootstrap
    from commitline.projections import PROJECTIONS

    with bootstrap() as app:
        report = app.status()
    by_name = {s.name: s for s in report.followers}
    head = report.head
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
    from commitline.cli.progress import progress_reporter
    from commitline.composition import bootstrap
    from commitline.projections.rebuild import RebuildError

    name = args.name
    with bootstrap() as app, progress_reporter(f"rebuild {name}") as progress:
        try:
            result = app.rebuild(name, progress=progress)
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


def cmd_intervene(args: argparse.Namespace) -> int:
    from commitline.composition import bootstrap
    from commitline.infrastructure.followers.interventions import InterventionRefused, retry, skip

    from commitline.infrastructure.kafka.publisher import PUBLISHER

    name = getattr(args, "name", PUBLISHER)
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


def _projection_name(text: str) -> str:
    from commitline.projections import PROJECTIONS

    if text not in PROJECTIONS:
        raise argparse.ArgumentTypeError(f"unknown projection {text!r}; known: {', '.join(sorted(PROJECTIONS))}")
    return text


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

    publisher = sub.add_parser("publisher", help="skip or retry the record the publisher stopped at")
    pubsub = publisher.add_subparsers(dest="publisher_command", required=True, metavar="ACTION")
    pubskip = pubsub.add_parser("skip", help="never publish the poison record the publisher stopped at (explicit, "
                                "logged); it continues after it")
    pubskip.add_argument("--position", type=int, required=True, help="the record's position, as status shows it")
    pubskip.add_argument("--reason", default="", help="why it is safe to skip it (kept in the intervention log)")
    pubskip.set_defaults(run=cmd_intervene, action="skip")
    pubretry = pubsub.add_parser("retry", help="try the record the publisher stopped at again (e.g. after raising "
                                 "COMMITLINE_KAFKA_MAX_MESSAGE_BYTES to the broker's limit)")
    pubretry.set_defaults(run=cmd_intervene, action="retry")

    status = sub.add_parser("status", help="show each follower's position, the log head and the lag")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(run=cmd_status)

    project = sub.add_parser("project", help="keep read models up to date until SIGINT/SIGTERM",
                             description="Run the projector of each named projection (default: all). Each applies "
                             "batches of events and its position in one transaction; one instance per projection "
                             "works at a time (advisory lock), others wait.")
    project.add_argument("names", nargs="*", metavar="NAME", type=_projection_name,
                         help="projections to run (default: all)")
    project.set_defaults(run=cmd_project)

    projections = sub.add_parser("projections", help="list, rebuild, skip a poison event, or retry a projection")
    psub = projections.add_subparsers(dest="projections_command", required=True, metavar="ACTION")
    plist = psub.add_parser("list", help="projections with their position, lag and status")
    plist.add_argument("--json", action="store_true", help="machine-readable output")
    plist.set_defaults(run=cmd_projections_list)
    prebuild = psub.add_parser("rebuild", help="rebuild from the first event into fresh tables, then swap atomically",
                               description="Readers keep the old complete view until the rebuilt one replaces it "
                               "in one transaction. Interrupt it and run it again to resume.")
    prebuild.add_argument("name", metavar="NAME", type=_projection_name)
    prebuild.set_defaults(run=cmd_projections_rebuild)
    pskip = psub.add_parser("skip", help="pass over the poison event a projection stopped at (explicit, logged)")
    pskip.add_argument("name", metavar="NAME", type=_projection_name)
    pskip.add_argument("--position", type=int, required=True, help="the poison event's position, as status shows it")
    pskip.add_argument("--reason", default="", help="why it is safe to skip it (kept in the intervention log)")
    pskip.set_defaults(run=cmd_intervene, action="skip")
    pretry = psub.add_parser("retry", help="let a projection stopped at a poison event try it again")
    pretry.add_argument("name", metavar="NAME", type=_projection_name)
    pretry.set_defaults(run=cmd_intervene, action="retry")

