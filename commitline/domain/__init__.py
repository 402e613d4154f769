"""Pure domain building blocks: aggregates, immutable events, transition tables as data, the errors every
domain shares, and the registry of one domain's event types. No I/O anywhere below; no domain of its own
(the examples live in ``commitline.examples``, a team's in its own package)."""

from __future__ import annotations

from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.registry import EventRegistry

__all__ = ["Aggregate", "Event", "EventRegistry"]
