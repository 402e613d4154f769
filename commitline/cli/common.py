"""What every ``commitline`` subcommand shares: exit codes, JSON output, argument types, and the domain this
process runs (``--app`` / ``COMMITLINE_APP``, chosen once by ``main``) with ``bootstrap`` over it."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO
from uuid import UUID

import orjson
from rich.console import Console

from commitline.application.errors import CommitlineError, ConfigurationError, HistoryBroken, StoreUnavailable

if TYPE_CHECKING:
    from commitline.composition import Commitline, Domain

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
_chosen: list[Domain] = []  # the domain ``main`` loaded for this process
APP_SPEC: list[str | None] = [None]  # the ``--app`` it was given, if any (worker processes need it too)


def use_domain(domain: Domain, spec: str | None = None) -> None:
    _chosen[:] = [domain]
    APP_SPEC[0] = spec


def domain() -> Domain:
    """The domain this process runs: the one ``main`` loaded, else the one ``COMMITLINE_APP`` names."""
    if not _chosen:
        import os

        from commitline.composition import load_domain

        _chosen.append(load_domain(os.environ.get("COMMITLINE_APP") or None))
    return _chosen[0]


#: connections a command that runs once keeps open (a long-running one keeps COMMITLINE_POOL_SIZE): twenty at
#: once from a script must not take two hundred of the server's connections
ONE_SHOT_POOL = 2


def bootstrap(*, long_running: bool = False, **options: Any) -> Commitline:
    """``commitline.bootstrap`` over this process's domain; a command that is not ``long_running`` keeps at most
    ``ONE_SHOT_POOL`` connections open (it may still open more under load, up to the pool's maximum)."""
    from commitline.composition import bootstrap as boot
    from commitline.composition import load_settings

    if not long_running and "settings" not in options:
        settings = load_settings()
        options["settings"] = settings.model_copy(update={"pool_size": min(settings.pool_size, ONE_SHOT_POOL)})
    app = boot(domain=domain(), **options)
    if long_running:
        warn_of_new_store(app)
    return app


def warn_of_new_store(app: Commitline) -> None:
    """A long-running process (``serve``, ``publish``, ``project``, ``sagas run``) that made the store of a
    configured database just now warns in its log: a mistyped COMMITLINE_SCHEMA would otherwise run a second,
    empty store beside the real one, healthy in every check. (An embedded database's first store is no news.)"""
    if app.created_store and app.settings.database_url is not None:
        logging.getLogger("commitline").warning(
            "schema %s held no commitline store: an empty one was made now (is COMMITLINE_SCHEMA, or the "
            "database, the one you meant? this process reads and writes that new store; `commitline migrate` "
            "makes a store without this warning)", app.settings.schema_name)


def note_new_store(app: Commitline) -> None:
    """For a command that only shows a store (``status`` without ``--check``, ``projections list``): say on stderr
    when the store it shows was made just now, empty (the schema held none). Commands whose answer could pass
    for an assurance (a health check, an audit, an erasure) refuse such a schema instead (``create_store``)."""
    if app.created_store:
        print(f"commitline: schema {app.settings.schema_name} held no commitline store: an empty one was made now "
              "(is COMMITLINE_SCHEMA, or the database, the one you meant?)", file=sys.stderr)


def print_json(value: Any, stream: TextIO = sys.stdout) -> None:
    stream.write(orjson.dumps(value, default=str).decode() + "\n")
    stream.flush()


def print_error(e: CommitlineError) -> None:
    print_json(e.to_dict(), sys.stderr)


def error_exit(e: CommitlineError, code: int) -> int:
    """Print ``e``; return ``code``, or EXIT_UNAVAILABLE when the store could not be used (retry then) or the
    configuration is wrong (a master key that opens nothing, say): neither is the command's fault."""
    print_error(e)
    # a history the store cannot replay is the store's fault too, one a retry does not mend
    return EXIT_UNAVAILABLE if isinstance(e, (StoreUnavailable, ConfigurationError, HistoryBroken)) else code


def console() -> Console:
    """A rich console; piped output gets a wide one so no table column is truncated."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


def actions(sub: argparse._SubParsersAction, name: str,  # type: ignore[type-arg]
            help: str) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    """The subcommand ``name`` and the subparsers of its actions (``commitline NAME ACTION``, chosen one in
    ``args.<name>_command``)."""
    return sub.add_parser(name, help=help).add_subparsers(dest=f"{name}_command", required=True, metavar="ACTION")


def declared(what: str, of: Callable[[Domain], Mapping[str, Any]]) -> Callable[[str], str]:
    """An argument type: the name of a ``what`` (projection, process manager) that ``of`` the domain lists."""

    def name(text: str) -> str:
        known = of(domain())
        if text not in known:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; known: {', '.join(sorted(known)) or 'none'}")
        return text

    return name


def tcp_port(text: str) -> int:
    """An argument naming a TCP port to listen on (1-65535)."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def aggregate_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an aggregate id (a UUID)") from None


def timestamp(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time, e.g. 2026-11-21T05:42:00+00:00") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset; add one, e.g. +00:00")
    return moment
