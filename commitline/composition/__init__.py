"""The composition root: ``bootstrap()`` (``wiring.py``) wires settings and a domain to the store, the processor
and every follower, and returns the ``Commitline`` (``root.py``, with its parts ``followers.py``,
``projections.py``, ``sagas.py`` and ``operations.py``) that builds what a program runs; ``status.py`` is the
status report it gives, ``errors.py`` what its callers catch, ``services.py`` the data folder's local services,
``setup.py`` what a program settles before bootstrapping, and ``consumers.py`` what a Kafka consumer of the
published records uses (``PersonalRecords``). The CLI, the HTTP server, the demo, the tests and
the benchmarks only call it.

Names are imported lazily (as ``commitline``'s own): a program that only loads its settings and domain
(``setup.py``) loads no database, Kafka or metrics client, so ``commitline serve`` can still choose how
``prometheus_client`` counts before it is first imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PARTS: dict[str, tuple[str, ...]] = {  # each module of this package, with the names it gives
    "root": ("Commitline",),
    "wiring": ("bootstrap", "connection_parts"),
    "status": ("FOLLOWER_ALIASES", "PUBLISHER", "StatusReport", "UnknownFollower"),
    "operations": ("MigrationReport",),
    "personal": ("ErasureReport",),
    "errors": ("InterventionRefused", "ProjectionNeedsRebuild", "RebuildError", "RebuildRunning",
               "UnknownProcessManager", "UnknownProjection"),
    "setup": ("Domain", "Query", "Settings", "load_domain", "load_settings", "set_kind"),
    "consumers": ("PersonalRecords",),
    "followers": ("check_publishing",),
}
_HOME = {name: part for part, names in _PARTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    return value


if TYPE_CHECKING:
    from commitline.composition.consumers import PersonalRecords
    from commitline.composition.followers import check_publishing
    from commitline.composition.errors import (
        InterventionRefused,
        ProjectionNeedsRebuild,
        RebuildError,
        RebuildRunning,
        UnknownProcessManager,
        UnknownProjection,
    )
    from commitline.composition.operations import MigrationReport
    from commitline.composition.personal import ErasureReport
    from commitline.composition.root import Commitline
    from commitline.composition.setup import Domain, Query, Settings, load_domain, load_settings, set_kind
    from commitline.composition.status import FOLLOWER_ALIASES, PUBLISHER, StatusReport, UnknownFollower
    from commitline.composition.wiring import bootstrap, connection_parts
