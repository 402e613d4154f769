"""What every ``commitline`` subcommand shares: exit codes, JSON output, argument types."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any, TextIO
from uuid import UUID

import orjson
from rich.console import Console

from commitline.application.errors import CommitlineError, StoreUnavailable

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def print_json(value: Any, stream: TextIO = sys.stdout) -> None:
    stream.write(orjson.dumps(value, default=str).decode() + "\n")
    stream.flush()


def print_error(e: CommitlineError) -> None:
    print_json(e.to_dict(), sys.stderr)


def error_exit(e: CommitlineError, code: int) -> int:
    """Print ``e``; return ``code``, or EXIT_UNAVAILABLE when the store could not be used (retry then)."""
    print_error(e)
    return EXIT_UNAVAILABLE if isinstance(e, StoreUnavailable) else code


def console() -> Console:
    """A rich console; piped output gets a wide one so no table column is truncated."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


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
