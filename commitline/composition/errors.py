"""The errors a caller of the composition root catches: the root's own (a projection or process manager it
does not know) and those the followers it builds raise at the operator (a projection whose tables must be
rebuilt, a rebuild that cannot go on, an intervention refused), so an entry point renders them without
importing the layers below."""

from __future__ import annotations

from collections.abc import Iterable

from commitline.infrastructure.followers.interventions import InterventionRefused
from commitline.projections.rebuild import RebuildError, RebuildRunning
from commitline.projections.storage import ProjectionNeedsRebuild


class UnknownProjection(LookupError):
    def __init__(self, unknown: Iterable[str], known: Iterable[str]):
        super().__init__(f"unknown projection(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


class UnknownProcessManager(LookupError):
    def __init__(self, unknown: str, known: Iterable[str], domain: str = ""):
        names = sorted(known)
        if not names:
            super().__init__(f"the domain {domain!r} declares no process manager")
        elif not unknown:
            super().__init__(f"the domain has several process managers: name one with --saga ({', '.join(names)})")
        else:
            super().__init__(f"unknown process manager {unknown!r}; known: {', '.join(names)}")


__all__ = ["InterventionRefused", "ProjectionNeedsRebuild", "RebuildError", "RebuildRunning",
           "UnknownProcessManager", "UnknownProjection"]
