"""Read models: the projection base (tables and ``@on`` handlers), the projector that keeps one up to date
exactly once, rebuilds, and the base of a domain's queries (``Reads``). No read model of its own: a
domain declares its read models (``Domain.read_model``)."""

from __future__ import annotations

from commitline.projections.base import Changes, Projection, Table, on
from commitline.projections.reads import Reads

__all__ = ["Changes", "Projection", "Reads", "Table", "on"]
