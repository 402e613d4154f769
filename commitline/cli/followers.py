"""Follower commands: ``publish``, ``publisher ...``, ``status``, ``project`` and ``projections ...``; the
``--metrics-port`` option of every command that runs followers (``publish``, ``project``, ``sagas run``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.table import Table

from commitline.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, console, print_json
from commitline.infrastructure.followers.process import describe
from commitline.infrastructure.followers.status import FollowerStatus

log = logging.getLogger(__name__)


def _metrics_port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=_metrics_port, metavar="PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics: every follower's position and "
                        "lag (read from PostgreSQL at each scrape) and this process's own counters; and "
                        "/healthz: 200 while this process's followers run (its liveness, for a container health "
                        "check), 503 when they hang or stopped; no API key")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="the address --metrics-port listens on (default 127.0.0.1)")


@contextmanager
def metrics_endpoint(args: argparse.Namespace, app: Any, followers: Sequence[Any]) -> Iterator[None]:
    """``/metrics`` on ``--metrics-port`` while the followers run (nothing without the option)."""
    if args.metrics_port is None:
        yield
        return
    from commitline.infrastructure.metrics import MetricsServer

    with MetricsServer(args.metrics_host, args.metrics_port, app.status, followers, app.liveness.problem):
        yield


def cmd_publish(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    with bootstrap() as app:
        # A configured database without KAFKA_BOOTSTRAP_SERVERS raises ConfigurationError here, before
        # anything is published or saved; ``main`` prints it and exits 3.
        publisher = app.publisher()
        if app.settings.kafka_bootstrap_servers is None:
            log.warning("no KAFKA_BOOTSTRAP_SERVERS and no COMMITLINE_DATABASE_URL: publishing the embedded "
                        "database's events to an embedded in-memory broker at %s (for development)",
                        publisher.settings.kafka_bootstrap_servers)
        with metrics_endpoint(args, app, [publisher]):
            app.run_until_signalled(publisher, drain=args.drain)
        m = publisher.metrics
        if args.json:
            print_json({"events_published": m.events_published, "batches": m.batches, "position": m.position,
                        "stopped_at_poison": publisher.waiting_for_operator})
        if publisher.waiting_for_operator:
            log.error("publisher stopped at a poison record after position %d (%d events published); "
                      "see `commitline status`, then `commitline publisher retry` or `skip`", m.position,
                      m.events_published)
            return EXIT_REFUSED
        log.info("publisher stopped cleanly: %d events in %d batches, position %d", m.events_published, m.batches,
                 m.position)
    return EXIT_OK


def status_table(head: int, statuses: list[FollowerStatus],
                 reasons: Callable[[FollowerStatus], list[str]] | None = None) -> Table:
    """One row per follower; ``reasons`` (default: its recorded error) fills the problem column."""
    table = Table(title=f"commitline followers (log head {head})")
    for column in ("follower", "status", "owner process", "position", "lag (events)", "lag (s)", "last moved",
                   "problem"):
        table.add_column(column)
    for s in statuses:
        if reasons is not None:
            problem = "; ".join(reasons(s))
        else:
            problem = f"{s.error.get('message', '')} at {s.error.get('position', '?')}" if s.error else ""
        moved = "" if s.last_moved_seconds is None else f"{s.last_moved_seconds:.0f} s ago"
        table.add_row(s.name, s.status, owner_text(s), str(s.position), str(s.lag_events),
                      f"{s.lag_seconds:.1f}", moved, f"[red]{problem}[/red]" if problem else "")
    return table


def owner_text(s: FollowerStatus) -> str:
    """The process owning a follower (``host:pid (kind, started ...)``) while one holds it, else the owner its row
    last named; never the PostgreSQL backend's pid, which is not a process of ours to act on."""
    if s.alive and s.process:
        return describe(s.process)
    return f"{s.owner} (last)" if s.owner else ""


def publisher_tables(report: Any) -> list[Table]:
    """The publish instances with their buckets, then every bucket with its owner, position and lag."""
    group = report.publisher
    instances = Table(title=f"publish instances ({group.bucket_count} buckets, COMMITLINE_PUBLISH_BUCKETS)")
    for column in ("instance", "buckets", "lag (events)"):
        instances.add_column(column)
    for m in group.members:
        lag = sum(group.buckets[b].lag_events for b in m.buckets)
        instances.add_row(describe(m.process) or m.owner or "?", group.describe(m), str(lag))
    if group.unowned:
        instances.add_row("[red]nobody[/red]", "", f"[red]{group.describe_buckets(group.unowned)}[/red]", "")
    buckets = Table(title="publisher buckets")
    for column in ("bucket", "status", "owner process", "position", "lag (events)", "lag (s)", "problem"):
        buckets.add_column(column)
    for s in group.buckets:
        problem = "; ".join(report.bucket_reasons(s))
        buckets.add_row(s.name, s.status, owner_text(s), str(s.position), str(s.lag_events), f"{s.lag_seconds:.1f}",
                        f"[red]{problem}[/red]" if problem else "")
    return [instances, buckets]


def cmd_status(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap
    from commitline.composition import UnknownFollower

    with bootstrap() as app:
        report = app.status()
    only = None
    if args.check:  # "--check NAME,NAME": judge only these, which must be running
        try:
            only = report.follower_names(n.strip() for n in args.check.split(",") if n.strip())
            if not only:
                raise UnknownFollower([repr(args.check)], [s.name for s in report.followers])
        except UnknownFollower as e:
            print(f"commitline status: {e}", file=sys.stderr)
            return EXIT_USAGE
    problems = report.problems(only)
    if args.json:
        print_json({"head": report.head, "healthy": not problems, "checked": only,
                    "problems": [str(p) for p in problems],
                    "thresholds": {"max_lag_events": report.thresholds.max_lag_events,
                                   "max_lag_seconds": report.thresholds.max_lag_seconds},
                    "followers": [{**s.as_dict(), "problems": report.reasons(s)} for s in report.followers],
                    "publisher": report.publisher_dict(),
                    "stuck_sagas": [{"saga": s.saga, "id": str(s.id), "tenant": s.tenant, "state": s.state,
                                     "reason": s.reason} for s in report.stuck],
                    "stuck_fulfilments": [str(s.id) for s in report.stuck]}, sys.stdout)
    elif args.check is None:
        out = console()
        out.print(status_table(report.head, report.followers, report.reasons))
        if report.publisher_ran:
            for table in publisher_tables(report):
                out.print(table)
        if report.stuck:
            out.print(f"[red]{len(report.stuck)} saga instance(s) STUCK or PARKED, needing manual intervention"
                      "[/red] (commitline sagas list --stuck)")
    if args.check is None:
        return EXIT_OK
    for problem in problems:  # one line per problem, on stderr
        print(f"unhealthy: {problem}", file=sys.stderr)
    if not args.json and not problems:
        checked = ", ".join(only) if only is not None else f"all {len(report.followers)} followers"
        print(f"healthy: {checked}")
    return EXIT_REFUSED if problems else EXIT_OK


def cmd_project(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    from commitline.projections.storage import ProjectionNeedsRebuild

    with bootstrap() as app:
        projectors = app.projectors(args.names)
        try:
            with metrics_endpoint(args, app, projectors):
                app.run_until_signalled(*projectors)
        except ProjectionNeedsRebuild as e:
            print(str(e), file=sys.stderr)
            return EXIT_REFUSED
    return EXIT_OK


def cmd_projections_list(args: argparse.Namespace) -> int:
    import psycopg

    from commitline.cli.common import bootstrap
    from commitline.projections.storage import check_shape, rebuild_command

    with bootstrap() as app:
        report = app.status()
        projections = app.domain.projections
        # Judged from the tables themselves, so a projection whose projector never started since shows it too.
        with psycopg.connect(**app.conninfo) as conn:
            shapes = {name: check_shape(conn, app.settings.schema_name, p) for name, p in projections.items()}
    by_name = {s.name: s for s in report.followers}
    head = report.head
    rows = []
    for name in sorted(projections):
        s = by_name.get(name)
        rebuilding = by_name.get(f"{name}@rebuild")
        rows.append({
            "name": name, "status": s.status if s else "never run", "position": s.position if s else 0,
            "lag_events": s.lag_events if s else head, "lag_seconds": s.lag_seconds if s else None,
            "error": s.error if s else None,
            "rebuild_position": rebuilding.position if rebuilding else None,
            "tables": [t.name for t in projections[name].tables],
            "needs_rebuild": shapes[name], "rebuild_command": rebuild_command(name) if shapes[name] else None,
        })
        if shapes[name]:
            rows[-1]["status"] = "needs rebuild"
    if args.json:
        print_json({"head": head, "projections": rows}, sys.stdout)
        return EXIT_OK
    table = Table(title=f"projections (log head {head})")
    for column in ("projection", "status", "position", "lag (events)", "lag (s)", "rebuild at", "error", "tables"):
        table.add_column(column)
    for r in rows:
        error = f"{r['error']['message']} at {r['error']['position']}" if r["error"] else ""
        if r["needs_rebuild"]:
            error = f"tables differ ({'; '.join(r['needs_rebuild'])}): run `{r['rebuild_command']}`"
        table.add_row(r["name"], r["status"], str(r["position"]), str(r["lag_events"]),
                      "" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}",
                      "" if r["rebuild_position"] is None else str(r["rebuild_position"]), error, ", ".join(r["tables"]))
    console().print(table)
    return EXIT_OK


def cmd_projections_rebuild(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap, domain
    from commitline.cli.progress import progress_reporter
    from commitline.projections.rebuild import RebuildError

    names = sorted(domain().projections) if args.all else list(dict.fromkeys(args.names))
    if not names:
        print("projections rebuild: name one or more projections, or --all", file=sys.stderr)
        return EXIT_USAGE
    if args.skip and len(names) > 1:
        print("projections rebuild: --skip names a position of one projection's log: rebuild that one alone",
              file=sys.stderr)
        return EXIT_USAGE
    what = ", ".join(names)
    if args.abort:
        with bootstrap() as app:
            for name in names:
                try:
                    found = app.abort_rebuild(name)
                except RebuildError as e:
                    print(str(e), file=sys.stderr)
                    return EXIT_REFUSED
                if args.json:
                    print_json({"projection": name, "aborted": found})
                else:
                    print(f"rebuild of {name} aborted: its tables and position were discarded; the live view is "
                          "untouched" if found else f"no rebuild of {name} to abort")
        return EXIT_OK
    skip = dict.fromkeys(args.skip, args.reason)
    with bootstrap() as app, progress_reporter(f"rebuild {what}") as progress:
        try:
            results = ([app.rebuild(names[0], progress=progress, skip=skip)] if len(names) == 1
                       else app.rebuild_many(names, progress=progress))
        except RebuildError as e:
            print(f"rebuild of {what} failed: {e}", file=sys.stderr)
            return EXIT_REFUSED
        except KeyboardInterrupt:
            print(f"rebuild of {what} interrupted; the live views are untouched. Run it again to resume.",
                  file=sys.stderr)
            return 130
    if args.json:
        print_json([{"projection": r.projection, "position": r.position, "events_applied": r.events_applied,
                     "seconds": round(r.seconds, 3), "resumed_from": r.resumed_from} for r in results])
        return EXIT_OK
    for result in results:
        rate = result.events_applied / result.seconds if result.seconds else 0
        resumed = f", resumed from position {result.resumed_from}" if result.resumed_from else ""
        print(f"rebuilt {result.projection}: position {result.position}, {result.events_applied} events in "
              f"{result.seconds:.1f} s ({rate:,.0f} events/s){resumed}; swapped in atomically")
    return EXIT_OK


def cmd_intervene(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap
    from commitline.infrastructure.followers.interventions import InterventionRefused, retry, skip

    from commitline.infrastructure.kafka.publisher import PUBLISHER

    name = getattr(args, "name", PUBLISHER)
    with bootstrap() as app:
        try:
            if name == PUBLISHER:
                message = _intervene_in_buckets(app, args)
            elif args.action == "skip":
                message = skip(app.datastore, name, args.position, args.reason)
            else:
                message = retry(app.datastore, name)
        except InterventionRefused as e:
            print(str(e), file=sys.stderr)
            return EXIT_REFUSED
    if args.json:
        print_json({"follower": name, "action": args.action, "position": getattr(args, "position", None),
                    "message": message})
    else:
        print(message)
    return EXIT_OK


def _intervene_in_buckets(app: Any, args: argparse.Namespace) -> str:
    """``publisher skip/retry``: a poison record stops only its bucket. ``skip --position N`` finds the bucket
    stopped at N; ``retry`` retries every stopped bucket. Then the publisher's own row is brought up to date."""
    from commitline.infrastructure.followers.group import stopped_buckets, write_summary
    from commitline.infrastructure.followers.interventions import retry, skip
    from commitline.infrastructure.followers.positions import Positions
    from commitline.infrastructure.kafka.publisher import PUBLISHER

    schema = app.datastore.schema
    with app.datastore.get_connection() as conn:
        stopped = stopped_buckets(conn, schema, PUBLISHER)
    if not stopped:  # nothing stopped in a bucket: the publisher's own row says why (or that nothing is)
        return (skip(app.datastore, PUBLISHER, args.position, args.reason) if args.action == "skip"
                else retry(app.datastore, PUBLISHER))
    if args.action == "skip":
        bucket = next((n for n, error in stopped if error.get("position") == args.position), stopped[0][0])
        message = skip(app.datastore, bucket, args.position, args.reason)
    else:
        message = "\n".join(retry(app.datastore, bucket) for bucket, _ in stopped)
    with app.datastore.get_connection() as conn:
        _, status, _ = Positions(schema).read(conn, PUBLISHER)
        write_summary(conn, schema, PUBLISHER, app.settings.publish_buckets, None,
                      "stopped" if status in ("failed", "retrying", "never run") else status)
    return message


def _projection_name(text: str) -> str:
    from commitline.cli.common import domain

    known = domain().projections
    if text not in known:
        raise argparse.ArgumentTypeError(f"unknown projection {text!r}; known: {', '.join(sorted(known)) or 'none'}")
    return text


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    publish = sub.add_parser(
        "publish",
        help="publish every stored event to Kafka in commit order until SIGINT/SIGTERM",
        description="Follow the notification log and publish each event (topic per aggregate type, key = aggregate "
        "id, acks=all). The log is divided into COMMITLINE_PUBLISH_BUCKETS buckets by aggregate id; any number of "
        "instances share them, each bucket owned by one live instance at a time (PostgreSQL advisory locks), "
        "rebalanced when instances join, leave or die. Each bucket's position is saved only after the broker "
        "acknowledged everything of it up to there.",
    )
    publish.add_argument("--drain", action="store_true", help="exit once everything stored so far is published")
    publish.add_argument("--json", action="store_true", help="at exit, what was published, as JSON on stdout")
    add_metrics_options(publish)
    publish.set_defaults(run=cmd_publish, long_running=True)

    publisher = sub.add_parser("publisher", help="skip or retry the record a publisher bucket stopped at")
    pubsub = publisher.add_subparsers(dest="publisher_command", required=True, metavar="ACTION")
    pubskip = pubsub.add_parser("skip", help="never publish the poison record the publisher stopped at (explicit, "
                                "logged); it continues after it")
    pubskip.add_argument("--position", type=int, required=True, help="the record's position, as status shows it")
    pubskip.add_argument("--reason", default="", help="why it is safe to skip it (kept in the intervention log)")
    pubskip.add_argument("--json", action="store_true", help="machine-readable output")
    pubskip.set_defaults(run=cmd_intervene, action="skip")
    pubretry = pubsub.add_parser("retry", help="try the record the publisher stopped at again (e.g. after raising "
                                 "COMMITLINE_KAFKA_MAX_MESSAGE_BYTES to the broker's limit)")
    pubretry.add_argument("--json", action="store_true", help="machine-readable output")
    pubretry.set_defaults(run=cmd_intervene, action="retry")

    status = sub.add_parser(
        "status", help="each follower's liveness, position and lag, and STUCK sagas; --check for health checks",
        description="Liveness comes from PostgreSQL: a follower is alive while a live session holds its advisory "
        "lock, 'dead' when its row says running but nobody holds it, 'never run' without a row. With --check, "
        "exit 0 when healthy, 1 when something is wrong (one 'unhealthy: ...' line per problem on stderr), "
        "3 when the store cannot be reached.")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument(
        "--check", nargs="?", const="", default=None, metavar="NAME,...",
        help="exit 1 if a follower is dead, stopped at a poison event, retrying or lagging beyond "
        "COMMITLINE_STATUS_MAX_LAG_EVENTS / _S, or a saga is STUCK; with names (aliases: publisher, sagas), judge "
        "only those followers, and count them unhealthy also when stopped or never run")
    status.set_defaults(run=cmd_status)

    project = sub.add_parser("project", help="keep read models up to date until SIGINT/SIGTERM",
                             description="Run the projector of each named projection (default: all). Each applies "
                             "batches of events and its position in one transaction; one instance per projection "
                             "works at a time (advisory lock), others wait.")
    project.add_argument("names", nargs="*", metavar="NAME", type=_projection_name,
                         help="projections to run (default: all)")
    add_metrics_options(project)
    project.set_defaults(run=cmd_project, long_running=True)

    projections = sub.add_parser("projections", help="list, rebuild, skip a poison event, or retry a projection")
    psub = projections.add_subparsers(dest="projections_command", required=True, metavar="ACTION")
    plist = psub.add_parser("list", help="projections with their position, lag and status")
    plist.add_argument("--json", action="store_true", help="machine-readable output")
    plist.set_defaults(run=cmd_projections_list)
    prebuild = psub.add_parser("rebuild", help="rebuild from the first event into fresh tables, then swap atomically",
                               description="Readers keep the old complete view until the rebuilt one replaces it "
                               "in one transaction. Interrupt it and run it again to resume. Several projections "
                               "(or --all) are rebuilt reading the log once, each swapped in on its own.")
    prebuild.add_argument("names", metavar="NAME", type=_projection_name, nargs="*")
    prebuild.add_argument("--all", action="store_true", help="rebuild every projection (reading the log once)")
    prebuild.add_argument("--skip", type=int, action="append", default=[], metavar="N",
                          help="pass the poison event at position N (explicit, logged; repeatable). Events the live "
                          "projection skipped are skipped again without it")
    prebuild.add_argument("--reason", default="", help="why skipping is safe (kept in the intervention log)")
    prebuild.add_argument("--abort", action="store_true",
                          help="discard an abandoned rebuild (its tables and position) instead of running one")
    prebuild.add_argument("--json", action="store_true", help="each rebuild's result as JSON on stdout")
    prebuild.set_defaults(run=cmd_projections_rebuild)
    pskip = psub.add_parser("skip", help="pass over the poison event a projection stopped at (explicit, logged)")
    pskip.add_argument("name", metavar="NAME", type=_projection_name)
    pskip.add_argument("--position", type=int, required=True, help="the poison event's position, as status shows it")
    pskip.add_argument("--reason", default="", help="why it is safe to skip it (kept in the intervention log)")
    pskip.add_argument("--json", action="store_true", help="machine-readable output")
    pskip.set_defaults(run=cmd_intervene, action="skip")
    pretry = psub.add_parser("retry", help="let a projection stopped at a poison event try it again")
    pretry.add_argument("name", metavar="NAME", type=_projection_name)
    pretry.add_argument("--json", action="store_true", help="machine-readable output")
    pretry.set_defaults(run=cmd_intervene, action="retry")

