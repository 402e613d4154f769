"""The domain's projections as ``Commitline`` builds them: a projector per read model, rebuilds (one, several
reading the log once, or an abandoned one discarded), and whether each one's tables still have the shape
its declaration gives them (``commitline projections list``).

``Projections`` is a part of ``Commitline`` (``root.py``): its methods use the root's settings, codec,
recorder, connection parameters and domain."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from commitline.composition.errors import UnknownProjection
from commitline.composition.rebuild_workers import WorkerOrder, rebuild_in_workers, split
from commitline.projections.base import Projection
from commitline.projections.projector import Projector
from commitline.projections.rebuild import Progress, RebuildResult, rebuild, rebuild_many
from commitline.projections.rebuild import abort as abort_rebuild
from commitline.projections.storage import check_shape, rebuild_command


class Projections:
    """Building, rebuilding and checking the domain's projections (a part of ``Commitline``)."""

    def projector(self, name: str, **options: Any) -> Projector:
        options.setdefault("batch_size", self.settings.project_batch_size)
        return Projector(self.projection(name), self.codec, self.recorder, self.conninfo, **options)

    def projectors(self, names: Iterable[str] = (), **options: Any) -> list[Projector]:
        return [self.projector(name, **options) for name in (list(names) or sorted(self.domain.projections))]

    def projection(self, name: str) -> Projection:
        known = self.domain.projections
        if name not in known:
            raise UnknownProjection([name], known)
        return known[name]()

    def rebuild(self, name: str, *, batch_size: int | None = None, progress: Progress | None = None,
                skip: dict[int, str] | None = None, fresh: bool = False) -> RebuildResult:
        """Rebuild projection ``name``; ``skip``: poison positions to pass with the operator's reason; ``fresh``:
        from the first event, discarding what an interrupted rebuild built."""
        return rebuild(self.projection(name), self.codec, self.recorder, self.conninfo,
                       batch_size=batch_size or self.settings.project_batch_size, progress=progress, skip=skip,
                       fresh=fresh)

    def rebuild_many(self, names: Iterable[str], *, batch_size: int | None = None,
                     progress: Progress | None = None, fresh: bool = False, jobs: int = 1) -> list[RebuildResult]:
        """Rebuild the named projections (all, if none are named), reading the log once for all of them;
        ``fresh``: from the first event, discarding what an interrupted rebuild built. ``jobs`` above 1: split
        into that many groups, each rebuilt by a process of its own, this one included (``rebuild_workers.py``:
        the others forked from this one)."""
        chosen = list(dict.fromkeys(names)) or sorted(self.domain.projections)
        projections = [self.projection(name) for name in chosen]
        batch_size = batch_size or self.settings.project_batch_size
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {jobs}")
        if jobs == 1 or len(projections) == 1:
            return rebuild_many(projections, self.codec, self.recorder, self.conninfo,
                                batch_size=batch_size, progress=progress, fresh=fresh)
        if self.reopen is None:  # type: ignore[attr-defined]
            raise ValueError("rebuilding in several processes needs a Commitline made by bootstrap(); or jobs=1")
        counts = self.recorder.topic_counts()
        groups = split({p.name: sum(counts.get(t, 0) for t in p.handled_topics()) for p in projections}, jobs)
        results = rebuild_in_workers(
            groups, lambda group, progress: self.rebuild_many(group, batch_size=batch_size, progress=progress,
                                                              fresh=fresh),
            WorkerOrder(self.reopen, batch_size, fresh), progress)
        return sorted(results, key=lambda r: chosen.index(r.projection))

    def abort_rebuild(self, name: str) -> bool:
        """Discard an abandoned rebuild of ``name``; False if there was none."""
        return abort_rebuild(self.projection(name), self.recorder, self.conninfo)

    def projection_shapes(self) -> dict[str, list[str]]:
        """Per projection, how its tables differ from its declaration ([] when they match), judged from the
        tables themselves, so a projection whose projector has not run since shows it too."""
        with psycopg.connect(**self.conninfo) as conn:
            return {name: check_shape(conn, self.settings.schema_name, projection)
                    for name, projection in self.domain.projections.items()}

    @staticmethod
    def rebuild_command(name: str, *, fresh: bool = False) -> str:
        """The command an operator runs to rebuild projection ``name`` (from the first event, with ``fresh``)."""
        return rebuild_command(name, fresh=fresh)
