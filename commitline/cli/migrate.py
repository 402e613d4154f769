"""``commitline migrate [--check]``: bring the schema to the version this commitline needs, or say how far
behind it is."""

from __future__ import annotations

import argparse
import sys

from commitline.cli.common import EXIT_OK, EXIT_REFUSED, print_json

EXIT_PENDING = EXIT_REFUSED


def cmd_migrate(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    with bootstrap(apply_migrations=False) as app:
        done = app.migrate(apply=not args.check)
    todo, schema, after, latest = done.pending, done.schema, done.version, done.latest
    report = {"schema": schema, "version": after, "latest": latest, "was": done.was,
              "pending": [{"version": m.version, "description": m.description} for m in todo] if args.check else [],
              "applied": [{"version": m.version, "description": m.description} for m in done.applied]}
    if args.json:
        print_json(report, sys.stdout)
    elif args.check:
        state = "up to date" if not todo else f"{len(todo)} migration(s) pending: " + ", ".join(
            f"{m.version} ({m.description})" for m in todo)
        print(f"schema {schema}: version {after} of {latest}, {state}")
    else:
        for m in done.applied:
            print(f"applied migration {m.version}: {m.description}")
        print(f"schema {schema}: version {after} of {latest}, up to date")
    return EXIT_PENDING if args.check and todo else EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    migrate = sub.add_parser(
        "migrate", help="apply pending schema migrations (every start also does), or --check without applying",
        description="Migrations are ordered and idempotent and run under the schema's advisory lock, so any number "
        "of processes may start or migrate at once. --check exits 1 when migrations are pending, 0 otherwise.")
    migrate.add_argument("--check", action="store_true", help="report only; exit 1 if migrations are pending")
    migrate.add_argument("--json", action="store_true", help="machine-readable output")
    migrate.set_defaults(run=cmd_migrate)
