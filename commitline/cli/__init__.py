"""The ``commitline`` console script: operator commands over the configured (or embedded) store, for the
domain ``--app module:attribute`` (or ``COMMITLINE_APP``) names; the built-in examples by default.

Exit codes: 0 success; 1 a command was invalid or refused (typed error as JSON on stderr);
2 bad usage; 3 configuration or store unavailable, or a domain that cannot be loaded (a message naming
the path, never a traceback). Each subcommand lives in its own module.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from commitline import __version__
from commitline.application.errors import ConfigurationError, InvalidApp, InvalidDomain, StoreUnavailable
from commitline.cli import (audit, demo, dispatch, followers, init, migrate, personal, projections, sagas, serve,
                            services, store, tenants)
from commitline.cli.common import EXIT_REFUSED, EXIT_UNAVAILABLE, print_error, print_json, use_domain
from commitline.composition import logs

LOG_LEVELS = logs.LOG_LEVELS
APP_HELP = ("the domain to run, as module:attribute (e.g. shelfwise.app:domain; default COMMITLINE_APP, else the "
            "built-in examples); the module is imported with the working directory first on the path")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commitline",
        description="Event-sourced command processor: validated, exactly-once state changes on PostgreSQL.",
        epilog="Configuration comes from environment variables (docs/reference/configuration.md). "
        "With no COMMITLINE_DATABASE_URL an embedded PostgreSQL is started in COMMITLINE_DATA_DIR.",
    )
    parser.add_argument("--version", action="version", version=f"commitline {__version__}")
    parser.add_argument("--app", metavar="MODULE:ATTRIBUTE", help=APP_HELP)
    parser.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper, help="log at this level on stderr (default "
                        "COMMITLINE_LOG_LEVEL, else INFO for serve, publish, project and sagas run, and WARNING for "
                        "the other commands, so that stderr holds only their typed error)")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    for module in (dispatch, followers, projections, sagas, audit, migrate, store, services, tenants, personal, serve,
                   demo, init):
        module.register(sub)
    return parser


def take_app(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--app X`` / ``--app=X`` wherever it stands in ``argv`` (before or after the subcommand), and the rest."""
    return take_option(argv, "--app")


def take_option(argv: list[str], option: str) -> tuple[str | None, list[str]]:
    """``option X`` / ``option=X`` wherever it stands in ``argv`` (before or after the subcommand; the last one
    given), and the rest."""
    value, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg == option and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith(option + "="):
            value, i = arg[len(option) + 1:], i + 1
            continue
        rest.append(arg)
        i += 1
    return value, rest


def main(argv: list[str] | None = None) -> int:
    from commitline.composition import load_domain, set_kind

    spec, argv = take_app(list(sys.argv[1:] if argv is None else argv))
    try:
        variable = "--app" if spec is not None else "COMMITLINE_APP"
        use_domain(load_domain(spec if spec is not None else os.environ.get("COMMITLINE_APP") or None,
                               variable=variable), spec)
    except (InvalidApp, InvalidDomain) as e:
        print(f"commitline: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    level, argv = take_option(argv, "--log-level")  # an option of every command, after it too
    args = build_parser().parse_args(argv if level is None else ["--log-level", level, *argv])
    set_kind(" ".join(filter(None, (args.subcommand, getattr(args, "sagas_command", None) if args.subcommand == "sagas"
                                    else None))))  # what status shows as the kind of this process
    if args.log_level is not None:  # the option wins over the variable, here and in every process started
        os.environ["COMMITLINE_LOG_LEVEL"] = args.log_level
    logs.configure(logs.chosen_level("INFO" if getattr(args, "long_running", False) else "WARNING"))
    try:
        return int(args.run(args))
    except (InvalidApp, InvalidDomain) as e:  # e.g. a store the domain cannot read, found at bootstrap
        print(f"commitline: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (ConfigurationError, StoreUnavailable) as e:
        print_error(e)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a defect (the domain's code, most likely): its traceback logged, then the usual error
        logging.getLogger("commitline.cli").exception("commitline %s failed unexpectedly", args.subcommand)
        print_json({"error": "InternalError", "code": "internal_error", "details": {"exception": type(e).__name__},
                    "message": f"internal error: {type(e).__name__} (the traceback above), a defect, in the "
                    "domain's code most likely"}, sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
