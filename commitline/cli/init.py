"""``commitline init PATH``: start a service with its own domain (``commitline.scaffold``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commitline.cli.common import EXIT_OK, EXIT_USAGE


def cmd_init(args: argparse.Namespace) -> int:
    from commitline.scaffold import ScaffoldRefused, write_service

    if not args.path.strip():
        print("commitline init: PATH is empty: name the folder to create (its name is the package's)",
              file=sys.stderr)
        return EXIT_USAGE
    path = Path(args.path)
    try:
        name, written = write_service(path)
    except ScaffoldRefused as e:
        print(f"commitline init: {e}", file=sys.stderr)
        return EXIT_USAGE
    for file in written:
        print(f"wrote {file}")
    print(f"\nnext: cd {path} && pip install -e '.[test]' && pytest && commitline --app {name}:domain serve")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    init = sub.add_parser("init", help="write a new service package with its own domain into PATH",
                          description="One aggregate with a transition table, two commands, one read model, "
                          "given/when/then specifications and a README with the commands to run it. The package is "
                          "named after the folder, which must be new or empty.")
    init.add_argument("path", metavar="PATH", help="the folder to create (its name is the package's)")
    init.set_defaults(run=cmd_init)
