"""Projection commands: ``project`` keeps read models up to date; ``projections list|rebuild|skip|retry``."""

from __future__ import annotations

import argparse
import sys

from rich.table import Table

from commitline.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, actions, console, declared, print_json
from commitline.cli.followers import add_metrics_options, cmd_intervene


def cmd_project(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    # A projection whose tables need a rebuild waits for it (logged, and failed in status) while the others run.
    with bootstrap(long_running=True) as app:
        projectors = app.projectors(args.names)
        with app.metrics_endpoint(args.metrics_host, args.metrics_port, projectors):
            app.run_until_signalled(*projectors)
    return EXIT_OK


def cmd_projections_list(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap, note_new_store

    with bootstrap() as app:
        note_new_store(app)
        report = app.status()
        projections = app.domain.projections
        shapes = app.projection_shapes()
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
            "needs_rebuild": shapes[name], "rebuild_command": app.rebuild_command(name) if shapes[name] else None,
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
                      "" if r["rebuild_position"] is None else str(r["rebuild_position"]), error,
                      ", ".join(r["tables"]))
    console().print(table)
    return EXIT_OK


def cmd_projections_rebuild(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap, domain
    from commitline.cli.progress import progress_reporter
    from commitline.composition import RebuildError
    from commitline.composition.rebuild_workers import available_cores

    names = sorted(domain().projections) if args.all else list(dict.fromkeys(args.names))
    if not names:
        print("projections rebuild: name one or more projections, or --all", file=sys.stderr)
        return EXIT_USAGE
    if args.skip and len(names) > 1:
        print("projections rebuild: --skip names a position of one projection's log: rebuild that one alone",
              file=sys.stderr)
        return EXIT_USAGE
    what = ", ".join(names)
    jobs = args.jobs if args.jobs is not None else min(available_cores(), len(names))
    if jobs < 1:
        print("projections rebuild: --jobs must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.abort:
        with bootstrap(create_store=False) as app:
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
    with bootstrap(create_store=False) as app, progress_reporter(f"rebuild {what}") as progress:
        try:
            results = ([app.rebuild(names[0], progress=progress, skip=skip, fresh=args.fresh)] if len(names) == 1
                       else app.rebuild_many(names, progress=progress, fresh=args.fresh, jobs=jobs))
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


_projection_name = declared("projection", lambda domain: domain.projections)


def _position(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an event's position (a notification id, 1 or more)")
    return int(text)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    project = sub.add_parser("project", help="keep read models up to date until SIGINT/SIGTERM",
                             description="Run the projector of each named projection (default: all). Each applies "
                             "batches of events and its position in one transaction; one instance per projection "
                             "works at a time (advisory lock), others wait.")
    project.add_argument("names", nargs="*", metavar="NAME", type=_projection_name,
                         help="projections to run (default: all)")
    add_metrics_options(project)
    project.set_defaults(run=cmd_project, long_running=True)

    psub = actions(sub, "projections", "list, rebuild, skip a poison event, or retry a projection")
    plist = psub.add_parser("list", help="projections with their position, lag and status")
    plist.add_argument("--json", action="store_true", help="machine-readable output")
    plist.set_defaults(run=cmd_projections_list)
    prebuild = psub.add_parser("rebuild", help="rebuild from the first event into fresh tables, then swap atomically",
                               description="Readers keep the old complete view until the rebuilt one replaces it "
                               "in one transaction. Interrupt it and run it again to resume. Several projections "
                               "(or --all) are rebuilt reading the log once, each swapped in on its own.")
    prebuild.add_argument("names", metavar="NAME", type=_projection_name, nargs="*",
                          help="the projections to rebuild (or --all)")
    prebuild.add_argument("--all", action="store_true", help="rebuild every projection (reading the log once per "
                          "process)")
    prebuild.add_argument("--jobs", type=int, metavar="N", help="rebuild several projections in N processes, each "
                          "reading the log once for its share (default: the cores this process may use, at most one "
                          "per projection; 1: all in this process)")
    prebuild.add_argument("--skip", type=_position, action="append", default=[], metavar="N",
                          help="pass the poison event at position N (explicit, logged; repeatable). Events the live "
                          "projection skipped are skipped again without it")
    prebuild.add_argument("--reason", default="", help="why skipping is safe (kept in the intervention log)")
    prebuild.add_argument("--fresh", action="store_true",
                          help="start from the first event even where an interrupted rebuild could resume (after "
                          "an erasure: rows it built before may hold the erased values)")
    prebuild.add_argument("--abort", action="store_true",
                          help="discard an abandoned rebuild (its tables and position) instead of running one")
    prebuild.add_argument("--json", action="store_true", help="each rebuild's result as JSON on stdout")
    prebuild.set_defaults(run=cmd_projections_rebuild)
    pskip = psub.add_parser("skip", help="pass over the poison event a projection stopped at (explicit, logged)")
    pskip.add_argument("name", metavar="NAME", type=_projection_name, help="the projection stopped at the event")
    pskip.add_argument("--position", type=int, required=True, help="the poison event's position, as status shows it")
    pskip.add_argument("--reason", default="", help="why it is safe to skip it (kept in the intervention log)")
    pskip.add_argument("--json", action="store_true", help="machine-readable output")
    pskip.set_defaults(run=cmd_intervene, action="skip")
    pretry = psub.add_parser("retry", help="let a projection stopped at a poison event try it again")
    pretry.add_argument("name", metavar="NAME", type=_projection_name, help="the projection stopped at the event")
    pretry.add_argument("--json", action="store_true", help="machine-readable output")
    pretry.set_defaults(run=cmd_intervene, action="retry")

