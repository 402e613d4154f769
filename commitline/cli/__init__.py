"""The ``commitline`` console script: operator commands over the configured (or embedded) store.

Exit codes: 0 success; 1 a command was invalid or refused (typed error as JSON on stderr);
2 bad usage; 3 configuration or store unavailable. Each subcommand lives in its own module.
"""

from __future__ import annotations

import argparse
import logging
import sys

from commitline.application.errors import ConfigurationError, StoreUnavailable
from commitline.cli import audit, dispatch, followers, migrate, sagas, serve, services, tenants
from commitline.cli.common import EXIT_UNAVAILABLE, print_error


def cmd_demo(args: argparse.Namespace) -> int:
    from commitline.cli.demo import run_demo

    return run_demo(into_configured_database=args.into_configured_database)



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commitline",
        description="Event-sourced command processor: validated, exactly-once state changes on PostgreSQL.",
        epilog="Configuration comes from environment variables (see the README). "
        "With no COMMITLINE_DATABASE_URL an embedded PostgreSQL is started in COMMITLINE_DATA_DIR.",
    )
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    for module in (dispatch, followers, sagas, audit, migrate, services, tenants, serve):
        module.register(sub)
    demo = sub.add_parser("demo", help="run the scripted demonstration workload and print a summary",
                          description="Runs on an embedded PostgreSQL. With COMMITLINE_DATABASE_URL set it "
                          "refuses (exit 2): its rows could never be removed from that append-only store.")
    demo.add_argument("--into-configured-database", action="store_true",
                      help="run anyway on the configured database, writing only into the schema "
                      "<COMMITLINE_SCHEMA>_demo (and topics <COMMITLINE_KAFKA_TOPIC_PREFIX>demo.*), never into "
                      "COMMITLINE_SCHEMA")
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return int(args.run(args))
    except (ConfigurationError, StoreUnavailable) as e:
        print_error(e)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
