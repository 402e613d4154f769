"""``commitline demo``: the domain's scripted demonstration (``Domain(..., demo=...)``), run where it can do
no harm: on the embedded PostgreSQL, or, only when asked, in a schema of its own in the configured database.

The store is append-only, so rows a demo writes can never be removed: with ``COMMITLINE_DATABASE_URL`` set
it refuses unless given ``--into-configured-database``, and then writes only into the schema
``<COMMITLINE_SCHEMA>_demo`` (and Kafka topics under ``<COMMITLINE_KAFKA_TOPIC_PREFIX>demo.``), never into
the configured schema.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from commitline.cli.common import EXIT_USAGE, domain

if TYPE_CHECKING:
    from commitline.composition import Settings

FLAG = "--into-configured-database"


def demo_settings(configured: Settings) -> Settings:
    """Where a demo writes in a configured database: its own schema and topics, beside the configured ones."""
    return configured.model_copy(update={"schema_name": f"{configured.schema_name}_demo",
                                         "kafka_topic_prefix": f"{configured.kafka_topic_prefix}demo."})


def cmd_demo(args: argparse.Namespace) -> int:
    from commitline.composition import load_settings

    chosen = domain()
    if chosen.demo is None:
        print(f"demo: the domain {chosen.name!r} declares no demo (Domain(..., demo=...)); without --app, "
              "`commitline demo` runs the built-in examples' demo", file=sys.stderr)
        return EXIT_USAGE
    settings = load_settings().for_domain(chosen.schema)
    if settings.database_url is not None:
        demo = demo_settings(settings)
        if not args.into_configured_database:
            print(f"demo: refused: COMMITLINE_DATABASE_URL is set, and the demo's rows could never be removed "
                  f"from that database (the store is append-only). Unset it to run the demo on an embedded "
                  f"PostgreSQL, or pass {FLAG} to write into the schema {demo.schema_name} of the configured "
                  f"database (never into {settings.schema_name}).", file=sys.stderr)
            return EXIT_USAGE
        settings = demo
    return int(chosen.demo(settings))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    demo = sub.add_parser("demo", help="run the domain's scripted demonstration workload and print a summary",
                          description="Runs on an embedded PostgreSQL. With COMMITLINE_DATABASE_URL set it "
                          "refuses (exit 2): its rows could never be removed from that append-only store.")
    demo.add_argument(FLAG, action="store_true",
                      help="run anyway on the configured database, writing only into the schema "
                      "<COMMITLINE_SCHEMA>_demo (and topics <COMMITLINE_KAFKA_TOPIC_PREFIX>demo.*), never into "
                      "COMMITLINE_SCHEMA")
    demo.set_defaults(run=cmd_demo)
