"""Which commitline process this is, as ``status`` shows a follower's owner: host, pid, kind (the command it
runs: ``publish``, ``project``, ``sagas run``, ``serve``, ...) and when it started. Written with every
claim of a follower (``positions.claim``), so an operator reads the process to act on, never only the
PostgreSQL session that holds its lock (whose pid is a database backend's)."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from typing import Any

import psutil

_KIND = ["python"]  # an application embedding commitline, unless a commitline command says what it is


def set_kind(kind: str) -> None:
    """What this process is, e.g. ``publish`` (the CLI sets it from the command it runs)."""
    _KIND[0] = kind


def this_process() -> dict[str, Any]:
    """This process as ``status`` shows owners: ``host``, ``pid``, ``kind``, ``started_at`` (ISO 8601)."""
    started = datetime.fromtimestamp(psutil.Process().create_time(), timezone.utc)
    return {"host": socket.gethostname(), "pid": os.getpid(), "kind": _KIND[0], "started_at": started.isoformat()}


def describe(process: dict[str, Any] | None) -> str:
    """``host:pid (kind, started at ...)``, or "" when unknown (a row written before owners were recorded)."""
    if not process:
        return ""
    started = str(process.get("started_at", ""))[:19].replace("T", " ")
    return f"{process.get('host')}:{process.get('pid')} ({process.get('kind')}, started {started} UTC)"
