"""commitline: an event-sourced command processor for systems where a wrong state costs money.

The public API is what this module exports (and ``commitline.testing``); a team's own package declares
its domain with it and runs it with ``bootstrap(domain=...)`` or ``commitline --app module:domain``::

    from commitline import Aggregate, Command, Domain, Event, Personal, Stream, transitions

Everything else is commitline's own: it may change between versions. Names are imported lazily, so
importing the domain building blocks does not load the database and Kafka clients.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # the domain's building blocks (pure, no I/O)
    "Aggregate": "commitline.domain.aggregate",
    "Event": "commitline.domain.aggregate",
    "TransitionTable": "commitline.domain.fsm",
    "table": "commitline.domain.fsm",
    "transitions": "commitline.domain.fsm",
    "CommitlineError": "commitline.domain.errors",
    "DomainError": "commitline.domain.errors",
    "IllegalTransition": "commitline.domain.errors",
    "InvalidValue": "commitline.domain.errors",
    "InvalidPersonalValue": "commitline.domain.errors",
    "Personal": "commitline.domain.personal",
    "Erased": "commitline.domain.personal",
    "ERASED": "commitline.domain.personal",
    "withheld": "commitline.domain.personal",
    # commands, their handling, process managers
    "Command": "commitline.application.commands",
    "VersionedCommand": "commitline.application.commands",
    "Amount": "commitline.application.commands",
    "Id": "commitline.application.commands",
    "Quantity": "commitline.application.commands",
    "Text": "commitline.application.commands",
    "NonBlankText": "commitline.application.commands",
    "Version": "commitline.application.commands",
    "Stream": "commitline.application.catalog",
    "Loader": "commitline.application.catalog",
    "ProcessManager": "commitline.application.process",
    "StuckInstance": "commitline.application.process",
    "InstanceRow": "commitline.application.process",
    "DispatchResult": "commitline.application.results",
    "AggregateAlreadyExists": "commitline.application.errors",
    "AggregateNotFound": "commitline.application.errors",
    "ConcurrencyConflict": "commitline.application.errors",
    "ConfigurationError": "commitline.application.errors",
    "IdempotencyKeyReused": "commitline.application.errors",
    "InvalidApp": "commitline.application.errors",
    "InvalidCommand": "commitline.application.errors",
    "InvalidDomain": "commitline.application.errors",
    "WrongMasterKey": "commitline.application.errors",
    "StoreUnavailable": "commitline.application.errors",
    "UnknownCommandType": "commitline.application.errors",
    "WrongAggregateType": "commitline.application.errors",
    "InternalCommandType": "commitline.application.errors",
    "MissingIdempotencyKey": "commitline.application.errors",
    "InvalidIdempotencyKey": "commitline.application.errors",
    "InvalidTenant": "commitline.application.errors",
    "EventTooLarge": "commitline.application.errors",
    "EventNotStorable": "commitline.application.errors",
    "Closed": "commitline.application.errors",
    "UnexpectedFailure": "commitline.application.errors",
    "AuditQueryError": "commitline.application.errors",
    "VersionBeyondHead": "commitline.application.errors",
    "BeforeCreation": "commitline.application.errors",
    "HistoryBroken": "commitline.application.errors",
    "IdempotencyRecordBroken": "commitline.application.ports",
    # read models
    "Projection": "commitline.projections.base",
    "Table": "commitline.projections.base",
    "Changes": "commitline.projections.base",
    "on": "commitline.projections.base",
    "Reads": "commitline.projections.reads",
    "RecordedEvent": "commitline.infrastructure.store.codec",
    # the domain object and running it
    "Domain": "commitline.framework.domain",
    "PortContext": "commitline.framework.domain",
    "Commitline": "commitline.composition",
    "bootstrap": "commitline.composition",
    # consuming what it publishes
    "PersonalRecords": "commitline.composition.consumers",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'commitline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # what editors and type checkers see; at run time the names above load on first use
    from commitline.application.catalog import Loader, Stream
    from commitline.application.commands import (
        Amount,
        Command,
        Id,
        NonBlankText,
        Quantity,
        Text,
        Version,
        VersionedCommand,
    )
    from commitline.application.errors import (
        AggregateAlreadyExists,
        AggregateNotFound,
        AuditQueryError,
        BeforeCreation,
        Closed,
        ConcurrencyConflict,
        ConfigurationError,
        EventNotStorable,
        EventTooLarge,
        HistoryBroken,
        IdempotencyKeyReused,
        InternalCommandType,
        InvalidApp,
        InvalidCommand,
        InvalidDomain,
        InvalidIdempotencyKey,
        InvalidTenant,
        MissingIdempotencyKey,
        StoreUnavailable,
        UnexpectedFailure,
        UnknownCommandType,
        VersionBeyondHead,
        WrongAggregateType,
        WrongMasterKey,
    )
    from commitline.application.ports import IdempotencyRecordBroken
    from commitline.application.process import InstanceRow, ProcessManager, StuckInstance
    from commitline.application.results import DispatchResult
    from commitline.composition import Commitline, bootstrap
    from commitline.composition.consumers import PersonalRecords
    from commitline.domain.aggregate import Aggregate, Event
    from commitline.domain.errors import (
        CommitlineError,
        DomainError,
        IllegalTransition,
        InvalidPersonalValue,
        InvalidValue,
    )
    from commitline.domain.fsm import TransitionTable, table, transitions
    from commitline.domain.personal import ERASED, Erased, Personal, withheld
    from commitline.framework.domain import Domain, PortContext
    from commitline.infrastructure.store.codec import RecordedEvent
    from commitline.projections.base import Changes, Projection, Table, on
    from commitline.projections.reads import Reads
