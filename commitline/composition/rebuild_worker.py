"""One worker process of a rebuild in several processes (``rebuild_workers.py``): ``python -m
commitline.composition.rebuild_worker``, started by the process rebuilding the first group.

It reads its order, one JSON object, from stdin: the settings (secrets in clear: never on its command line, nor
added to its environment), the domain as ``module:attribute``, the projections of its group, the batch size,
``fresh``, the parent's ``sys.path`` (the domain imports as it did there) and the parent's pid. It rebuilds its group reading
the log once for it (``Commitline.rebuild_many``) and says what happens as one JSON object per line on stdout:
``{"progress": [position, head, applied]}`` per batch, then ``{"results": [...]}``, ``{"error": "..."}`` or
``{"interrupted": true}``. SIGINT interrupts it as Ctrl-C would (the rebuild stops after its batch, resumable);
so does its parent's death.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from collections.abc import Callable
from typing import IO, Any

from commitline.composition.orphans import end_with_parent
from commitline.composition.wiring import bootstrap
from commitline.infrastructure.config import Settings
from commitline.projections.rebuild import RebuildError


def main(stdin: IO[str], say: Callable[[dict[str, Any]], None]) -> int:
    order = json.loads(stdin.readline())
    sys.path[:0] = [p for p in order["path"] if p not in sys.path]
    try:
        _interrupted_when_orphaned(order["parent"])
        with bootstrap(Settings(**order["settings"]), domain=order["domain"], apply_migrations=False) as app:
            results = app.rebuild_many(order["names"], batch_size=order["batch_size"], fresh=order["fresh"],
                                       progress=lambda position, head, applied: say(
                                           {"progress": [position, head, applied]}))
    except KeyboardInterrupt:
        say({"interrupted": True})
        return 130
    except Exception as e:  # every error is said to the parent, which reports it with the others
        say({"error": str(e) if isinstance(e, RebuildError) else f"{type(e).__name__}: {e}"})
        return 1
    say({"results": [dataclasses.asdict(r) for r in results]})
    return 0


def _interrupted_when_orphaned(parent: int) -> None:
    """Be interrupted, as by Ctrl-C, when the process that started this one dies (killed with -9, say): a worker
    never rebuilds on unattended. SIGINT is made Python's own first: a command started in the background by a
    script (``cmd &`` in a non-interactive shell) hands its workers SIGINT ignored, and the signal, the parent's
    Ctrl-C as well as the kernel's at its death, would then do nothing."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not end_with_parent(signal.SIGINT, parent):
        raise KeyboardInterrupt


def _say(message: dict[str, Any], out: IO[str] = sys.stdout) -> None:
    try:
        out.write(json.dumps(message) + "\n")
        out.flush()
    except OSError:  # the parent is gone (its end of the pipe with it): it is interrupting this one
        pass


if __name__ == "__main__":
    sys.exit(main(sys.stdin, _say))
