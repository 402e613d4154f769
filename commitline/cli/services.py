"""``commitline up`` and ``down``: keep the data folder's local services (its embedded PostgreSQL and, when
no Kafka is configured, its embedded broker, which keeps records in memory only) running between
commands, and stop them when done."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from commitline.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, print_json


def _services() -> dict[str, Any]:
    from commitline.composition import load_settings
    from commitline.composition.services import local_services

    return local_services(load_settings())


def cmd_up(args: argparse.Namespace) -> int:
    from commitline.application.errors import ConfigurationError
    from commitline.composition.services import keep_running

    services = _services()
    if not services:
        print("COMMITLINE_DATABASE_URL is set: there is no local service to start (a configured database is "
              "published only to a configured Kafka, whose positions it keeps: set KAFKA_BOOTSTRAP_SERVERS; a broker "
              "without idempotent producers, such as the embedded one, also needs COMMITLINE_KAFKA_IDEMPOTENCE=false)",
              file=sys.stderr)
        if args.json:  # nothing started: the same JSON as `down --json` then
            print_json({}, sys.stdout)
        return EXIT_OK
    try:
        report = keep_running(services)
    except ConfigurationError as e:  # COMMITLINE_DATA_DIR: why its service cannot start
        print(str(e), file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        print_json(report, sys.stdout)
        return EXIT_OK
    labels = {"postgres": "embedded PostgreSQL", "kafka": "embedded Kafka-protocol broker (records in memory only)"}
    for name, entry in report.items():
        print(f"{labels[name]} {entry['state']} at {entry['at']}")
    print("they keep running until `commitline down`")
    return EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    from commitline.composition.services import stop

    services = _services()
    if not services:
        print("COMMITLINE_DATABASE_URL is set: there is no local service to stop", file=sys.stderr)
        if args.json:
            print_json({}, sys.stdout)
        return EXIT_OK
    refused, states = [], {}
    for name, state, in_use in stop(services, force=args.force):
        if in_use:
            refused.append(name)
        states[name] = state
        if not args.json:
            print(f"{name}: {state}")
    if args.json:
        print_json(states, sys.stdout)
    if refused:
        print(f"{', '.join(refused)} in use by other commitline processes: stop them first (the last of them stops "
              "it), or use --force", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    up = sub.add_parser("up", help="start the local services of COMMITLINE_DATA_DIR and keep them running",
                        description="Every commitline process using a data folder shares its embedded PostgreSQL "
                        "(and, without KAFKA_BOOTSTRAP_SERVERS, its embedded broker, which keeps records in memory "
                        "only): the first process starts them, the last one stops them. `up` keeps them running "
                        "between commands until `commitline down`.")
    up.add_argument("--json", action="store_true", help="machine-readable output")
    up.set_defaults(run=cmd_up)
    down = sub.add_parser("down", help="stop the local services of COMMITLINE_DATA_DIR (PostgreSQL's data is kept)")
    down.add_argument("--force", action="store_true",
                      help="stop them even while other commitline processes use them (they lose their connections)")
    down.add_argument("--json", action="store_true", help="machine-readable output")
    down.set_defaults(run=cmd_down)
