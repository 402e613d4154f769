"""The composition root: ``bootstrap()`` wires settings and a domain to the store, the processor and every
follower, and returns the ``Commitline`` that builds what a program runs (``root.py``); ``status.py`` is the
status report it gives. The CLI, the HTTP server, the demo, the tests and the benchmarks only call it."""

from __future__ import annotations

from commitline.composition.root import (
    Commitline,
    UnknownProcessManager,
    UnknownProjection,
    bootstrap,
    connection_parts,
)
from commitline.composition.status import FOLLOWER_ALIASES, StatusReport, UnknownFollower

__all__ = ["FOLLOWER_ALIASES", "Commitline", "StatusReport", "UnknownFollower", "UnknownProcessManager",
           "UnknownProjection", "bootstrap", "connection_parts"]
