"""Which event types and aggregates a domain holds: the lookups every reader of stored events needs.

Built from a domain's aggregates (each lists its ``EVENTS``), so the store, the followers, Kafka and the
audit know the event classes of the domain they were given and of no other. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

from commitline.domain.aggregate import Aggregate, Event


class EventRegistry:
    """The aggregates of one domain, their event classes by stored type name, and each event's aggregate."""

    def __init__(self, aggregates: Iterable[type[Aggregate]]):
        self.aggregates: tuple[type[Aggregate], ...] = tuple(aggregates)
        self.aggregate_types = MappingProxyType({a.__name__: a for a in self.aggregates})
        self.event_types = MappingProxyType({e.type_name(): e for a in self.aggregates for e in a.EVENTS})
        self.aggregate_of_event = MappingProxyType({e: a for a in self.aggregates for e in a.EVENTS})

    def event_class(self, type_name: str) -> type[Event] | None:
        return self.event_types.get(type_name)

    def aggregate_name_of(self, type_name: str) -> str:
        """The aggregate type that records events of ``type_name``; LookupError for a type not in the domain."""
        cls = self.event_types.get(type_name)
        if cls is None:
            raise LookupError(f"no event class is registered for stored type {type_name!r}")
        return self.aggregate_of_event[cls].__name__
