"""Pure domain model: aggregates, their events and transition tables. No I/O anywhere below."""

from __future__ import annotations

from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.fulfilment import OrderFulfilment
from commitline.domain.inventory import InventoryItem
from commitline.domain.order import Order
from commitline.domain.payment import PaymentTransaction
from commitline.domain.survey import SurveyAssignment, SurveyTask

AGGREGATES: tuple[type[Aggregate], ...] = (
    PaymentTransaction, InventoryItem, SurveyTask, SurveyAssignment, Order, OrderFulfilment,
)

EVENT_TYPES: dict[str, type[Event]] = {e.type_name(): e for a in AGGREGATES for e in a.EVENTS}
AGGREGATE_OF_EVENT: dict[type[Event], type[Aggregate]] = {e: a for a in AGGREGATES for e in a.EVENTS}
AGGREGATE_TYPES: dict[str, type[Aggregate]] = {a.__name__: a for a in AGGREGATES}

assert len(EVENT_TYPES) == sum(len(a.EVENTS) for a in AGGREGATES), "event type names must be unique"

__all__ = ["AGGREGATES", "AGGREGATE_OF_EVENT", "AGGREGATE_TYPES", "EVENT_TYPES", "Aggregate", "Event"]
