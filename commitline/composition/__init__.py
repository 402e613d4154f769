"""The composition root: ``bootstrap()`` (``wiring.py``) wires settings and a domain to the store, the processor
and every follower, and returns the ``Commitline`` (``root.py``, with its parts ``followers.py``,
``projections.py``, ``sagas.py`` and ``operations.py``) that builds what a program runs; ``status.py`` is the
status report it gives, ``errors.py`` what its callers catch, ``services.py`` the data folder's local services
and ``setup.py`` what a program settles before bootstrapping. The CLI, the HTTP server, the demo, the tests and
the benchmarks only call it.

Names are imported lazily (as ``commitline``'s own): a program that only loads its settings and domain
(``setup.py``) loads no database, Kafka or metrics client, so ``commitline serve`` can still choose how
``prometheus_client`` counts before it is first imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "Commitline": "commitline.composition.root",
    "bootstrap": "commitline.composition.wiring",
    "connection_parts": "commitline.composition.wiring",
    "FOLLOWER_ALIASES": "commitline.composition.status",
    "PUBLISHER": "commitline.composition.status",
    "StatusReport": "commitline.composition.status",
    "UnknownFollower": "commitline.composition.status",
    "MigrationReport": "commitline.composition.operations",
    "InterventionRefused": "commitline.composition.errors",
    "ProjectionNeedsRebuild": "commitline.composition.errors",
    "RebuildError": "commitline.composition.errors",
    "UnknownProcessManager": "commitline.composition.errors",
    "UnknownProjection": "commitline.composition.errors",
    "Domain": "commitline.composition.setup",
    "Query": "commitline.composition.setup",
    "Settings": "commitline.composition.setup",
    "load_domain": "commitline.composition.setup",
    "load_settings": "commitline.composition.setup",
    "set_kind": "commitline.composition.setup",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from commitline.composition.errors import (
        InterventionRefused,
        ProjectionNeedsRebuild,
        RebuildError,
        UnknownProcessManager,
        UnknownProjection,
    )
    from commitline.composition.operations import MigrationReport
    from commitline.composition.root import Commitline
    from commitline.composition.setup import Domain, Query, Settings, load_domain, load_settings, set_kind
    from commitline.composition.status import FOLLOWER_ALIASES, PUBLISHER, StatusReport, UnknownFollower
    from commitline.composition.wiring import bootstrap, connection_parts
