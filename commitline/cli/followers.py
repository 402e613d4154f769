"""Follower commands: ``publish``, ``publisher skip|retry``, ``followers reset`` and ``status``; skipping or retrying
the poison event a follower stopped at (the publisher's, a projection's), resetting one after the store went back; the ``--metrics-port`` option of every command that runs
followers (``publish``, ``project``, ``sagas run``)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from rich.table import Table

from commitline.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, actions, console, print_json, tcp_port

if TYPE_CHECKING:
    from commitline.composition import StatusReport

log = logging.getLogger(__name__)


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=tcp_port, metavar="PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics: every follower's position and "
                        "lag (read from PostgreSQL at each scrape) and this process's own counters; and "
                        "/healthz: 200 while this process's followers run (its liveness, for a container health "
                        "check), 503 when they hang or stopped; any other path 404; no API key")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="the address --metrics-port listens on (default 127.0.0.1)")


def cmd_publish(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap, domain
    from commitline.composition import check_publishing, load_settings

    # A configured database without KAFKA_BOOTSTRAP_SERVERS: ConfigurationError before the store is opened (or
    # made), nothing published or saved; ``main`` prints it and exits 3.
    check_publishing(load_settings().for_domain(domain().schema))
    with bootstrap(long_running=True) as app:
        publisher = app.publisher()
        if app.settings.kafka_bootstrap_servers is None:
            log.warning("no KAFKA_BOOTSTRAP_SERVERS and no COMMITLINE_DATABASE_URL: publishing the embedded "
                        "database's events to an embedded in-memory broker at %s (for development)",
                        publisher.settings.kafka_bootstrap_servers)
        with app.metrics_endpoint(args.metrics_host, args.metrics_port, [publisher]):
            drained = app.run_until_signalled(publisher, drain=args.drain)
        m = publisher.metrics
        went_back = publisher.waiting_for_operator and app.status().publisher_went_back
        if args.json:
            print_json({"events_published": m.events_published, "batches": m.batches, "position": m.position,
                        "stopped_at_poison": publisher.waiting_for_operator and not went_back,
                        "store_went_back": went_back})
        if not drained:  # a signal before the drain was done: events still wait (a broker down, say)
            log.error("publisher interrupted before it caught up: position %d, %d events published; the events "
                      "after it are not published yet (see `commitline status`)", m.position, m.events_published)
            return EXIT_REFUSED
        # A drain that ends at a stop did not publish everything: exit 1. Stopped by a signal, a long-running
        # publisher exits 0 as documented (a supervisor restarting it is not told of a crash); the stop stays
        # recorded, and ``status`` (``--check``) reports it.
        stopped = EXIT_REFUSED if args.drain else EXIT_OK
        if went_back:
            log.error("publisher stopped after position %d (%d events published): the store went back behind its "
                      "buckets; see `commitline status` and docs/guides/failover.md (`commitline followers reset "
                      "publisher`)", m.position, m.events_published)
            return stopped
        if publisher.waiting_for_operator:
            log.error("publisher stopped at a poison record after position %d (%d events published); see "
                      "`commitline status`, then `commitline publisher retry` or `skip`", m.position,
                      m.events_published)
            return stopped
        log.info("publisher stopped cleanly: %d events in %d batches, position %d", m.events_published, m.batches,
                 m.position)
    return EXIT_OK


def status_table(report: StatusReport) -> Table:
    """One row per follower, with the process owning it and its problems."""
    table = Table(title=f"commitline followers (log head {report.head})")
    for column in ("follower", "status", "owner process", "position", "lag (events)", "lag (s)", "last moved",
                   "problem"):
        table.add_column(column)
    for s in report.followers:
        problem = "; ".join(report.reasons(s))
        moved = "" if s.last_moved_seconds is None else f"{s.last_moved_seconds:.0f} s ago"
        table.add_row(s.name, s.status, report.owner_of(s), str(s.position), str(s.lag_events),
                      f"{s.lag_seconds:.1f}", moved, f"[red]{problem}[/red]" if problem else "")
    return table


def publisher_tables(report: StatusReport) -> list[Table]:
    """The publish instances with their buckets, then every bucket with its owner, position and lag."""
    group = report.publisher
    instances = Table(title=f"publish instances ({group.bucket_count} buckets, COMMITLINE_PUBLISH_BUCKETS)")
    for column in ("instance", "buckets", "lag (events)"):
        instances.add_column(column)
    for m in group.members:
        lag = sum(group.buckets[b].lag_events for b in m.buckets)
        instances.add_row(report.instance_of(m), group.describe(m), str(lag))
    if group.unowned:
        lag = sum(group.buckets[b].lag_events for b in group.unowned)
        instances.add_row("[red]nobody[/red]", f"[red]{group.describe_buckets(group.unowned)}[/red]", str(lag))
    buckets = Table(title="publisher buckets")
    for column in ("bucket", "status", "owner process", "position", "lag (events)", "lag (s)", "problem"):
        buckets.add_column(column)
    for s in group.buckets:
        problem = "; ".join(report.bucket_reasons(s))
        buckets.add_row(s.name, s.status, report.owner_of(s), str(s.position), str(s.lag_events),
                        f"{s.lag_seconds:.1f}", f"[red]{problem}[/red]" if problem else "")
    return [instances, buckets]


def cmd_status(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap, note_new_store
    from commitline.composition import UnknownFollower

    with bootstrap(create_store=args.check is None) as app:  # a health check never passes on a mistyped schema
        note_new_store(app)
        report = app.status()
    only = None
    if args.check:  # "--check NAME,NAME": judge only these, which must be running
        try:
            only = report.follower_names(n.strip() for n in args.check.split(",") if n.strip())
            if not only:
                raise UnknownFollower([repr(args.check)], [s.name for s in report.followers],
                                      ("publisher", "sagas") if report.sagas else ("publisher",))
        except UnknownFollower as e:
            print(f"commitline status: {e}", file=sys.stderr)
            return EXIT_USAGE
    problems = report.problems(only)
    if args.json:
        print_json({"head": report.head, "healthy": not problems, "checked": only,
                    "problems": [str(p) for p in problems],
                    "thresholds": {"max_lag_events": report.thresholds.max_lag_events,
                                   "max_lag_seconds": report.thresholds.max_lag_seconds},
                    "followers": [{**s.as_dict(), "owned_by": report.owner_of(s), "problems": report.reasons(s)}
                                  for s in report.followers],
                    "publisher": report.publisher_dict(),
                    "stuck_sagas": [{"saga": s.saga, "id": str(s.id), "tenant": s.tenant, "state": s.state,
                                     "reason": s.reason} for s in report.stuck],
                    "stuck_fulfilments": [str(s.id) for s in report.stuck]}, sys.stdout)
    elif args.check is None:
        out = console()
        out.print(status_table(report))
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
        if only is not None:
            checked = ", ".join(only)
        else:  # which followers run is a deployment's choice: those that do not are counted, not judged
            idle = sum(not f.alive for f in report.followers)
            checked = f"all {len(report.followers)} followers" + (f" ({idle} not running)" if idle else "")
        print(f"healthy: {checked}")
    return EXIT_REFUSED if problems else EXIT_OK


def cmd_intervene(args: argparse.Namespace) -> int:
    """``publisher skip|retry`` and ``projections skip|retry NAME``."""
    from commitline.cli.common import bootstrap
    from commitline.composition import PUBLISHER, InterventionRefused

    name = getattr(args, "name", PUBLISHER)
    with bootstrap(create_store=False) as app:
        # what a retry tries again, read before it (the retry clears it); a skip names its position itself
        positions = app.stopped_positions(name) if args.action == "retry" else [getattr(args, "position", None)]
        try:
            message = app.intervene(name, args.action, getattr(args, "position", None), getattr(args, "reason", ""))
        except InterventionRefused as e:
            print(str(e), file=sys.stderr)
            return EXIT_REFUSED
    if args.json:  # "position": the (lowest) event retried or skipped; "positions": each stopped bucket's
        print_json({"follower": name, "action": args.action, "position": positions[0] if positions else None,
                    "positions": positions, "message": message})
    else:
        print(message)
    return EXIT_OK


def cmd_reset(args: argparse.Namespace) -> int:
    """``followers reset NAME --from-head | --from N | --keep``."""
    from commitline.cli.common import bootstrap
    from commitline.composition import InterventionRefused, UnknownFollower

    choice = "from-head" if args.from_head else "keep" if args.keep else "from"
    with bootstrap(create_store=False) as app:
        try:
            message = app.reset_follower(args.name, choice, args.position, args.reason)
        except UnknownFollower as e:
            print(f"commitline followers reset: {e}", file=sys.stderr)
            return EXIT_USAGE
        except InterventionRefused as e:
            print(f"commitline followers reset: {e}", file=sys.stderr)
            return EXIT_REFUSED
        report = app.status() if args.json else None
    if report is not None:  # the position it goes on after, whichever the choice (--from-head, --keep: the store's)
        (name,) = report.follower_names([args.name])
        after = next((f.position for f in report.followers if f.name == name), args.position)
        print_json({"follower": args.name, "choice": choice, "position": after, "message": message})
    else:
        print(message)
    return EXIT_OK


def _position(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a position (a notification id, 0 or more)")
    return int(text)


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
    publish.add_argument("--drain", action="store_true", help="exit once everything stored so far is published "
                         "(exit 1 when a signal stops it before: events still wait)")
    publish.add_argument("--json", action="store_true", help="at exit, what was published, as JSON on stdout")
    add_metrics_options(publish)
    publish.set_defaults(run=cmd_publish, long_running=True)

    pubsub = actions(sub, "publisher", "skip or retry the record a publisher bucket stopped at")
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

    fsub = actions(sub, "followers", "reset a follower stopped because the store went back (a restore, an "
                   "asynchronous failover)")
    reset = fsub.add_parser(
        "reset", help="say where a follower goes on after the store went back, in the current generation",
        description="A follower stops (status failed, store_went_back) when the store's generation is not the one "
        "its position was saved in (commitline store new-generation), when its position is beyond the log head, or, "
        "for the publisher, when Kafka holds records the store lost. Choose where it goes on: --from-head (skip to "
        "the log head: what the store holds now up to there is not handled again), --from N (from after position N, "
        "e.g. the head the generation started at), or --keep (its position stands: for a projection, this confirms "
        "the read model, which is consistent with the restored store; `commitline projections rebuild NAME` is the "
        "other choice). The publisher's buckets are reset together. A follower that never ran (a new generation does "
        "not stop it: it would start from the first event) is placed where told, --keep meaning the first event. A "
        "running instance stopped this way goes on by itself; the decision is kept in the intervention log.")
    reset.add_argument("name", metavar="NAME", help="the follower: a projection, a process manager, or the "
                       "publisher (publisher or kafka-publisher)")
    choice = reset.add_mutually_exclusive_group(required=True)
    choice.add_argument("--from-head", action="store_true", help="go on from the store's log head")
    choice.add_argument("--from", dest="position", type=_position, metavar="N", help="go on after position N")
    choice.add_argument("--keep", action="store_true", help="keep the position it has")
    reset.add_argument("--reason", default="", help="why (kept in the intervention log)")
    reset.add_argument("--json", action="store_true", help="machine-readable output")
    reset.set_defaults(run=cmd_reset)

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
