"""Every typed error a caller of commitline can receive, importable from this one module.

Each carries ``code`` (stable, machine-readable), ``details()`` (fields) and ``to_dict()``.
Whenever one of these is raised by ``CommandProcessor.dispatch``, nothing was written.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from commitline.domain.errors import (
    CommitlineError,
    DomainError,
    DuplicateReservation,
    IllegalTransition,
    InsufficientStock,
    InvalidValue,
    TaskClosed,
    UnknownReservation,
    UserNotIssued,
    UsersAlreadyIssued,
)


class InvalidCommand(CommitlineError):
    """The command failed validation; ``errors`` lists each field and what was wrong."""

    code = "invalid_command"

    def __init__(self, command_type: str | None, errors: list[dict[str, Any]]):
        self.command_type = command_type
        self.errors = errors
        summary = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<command>'}: {e['msg']}" for e in errors)
        super().__init__(f"invalid {command_type or 'command'}: {summary}")

    def details(self) -> dict[str, Any]:
        return {"command_type": self.command_type, "errors": self.errors}


class UnknownCommandType(CommitlineError):
    code = "unknown_command_type"

    def __init__(self, command_type: object, known: list[str]):
        self.command_type = command_type
        self.known = known
        super().__init__(f"unknown command type {command_type!r}; known types: {', '.join(known)}")

    def details(self) -> dict[str, Any]:
        return {"command_type": str(self.command_type), "known": self.known}


class MissingIdempotencyKey(CommitlineError):
    code = "missing_idempotency_key"

    def __init__(self, command_type: str, reason: str = "state-changing commands require an idempotency key"):
        self.command_type = command_type
        self.reason = reason
        super().__init__(f"{command_type}: {reason}")

    def details(self) -> dict[str, Any]:
        return {"command_type": self.command_type, "reason": self.reason}


class InvalidTenant(CommitlineError):
    code = "invalid_tenant"

    def __init__(self, tenant: object):
        self.tenant = tenant
        super().__init__(f"tenant {tenant!r} must be 1-64 characters of letters, digits, '.', '_' or '-'")

    def details(self) -> dict[str, Any]:
        return {"tenant": str(self.tenant)}


class IdempotencyKeyReused(CommitlineError):
    """The key was already used for a different request; the earlier outcome stands."""

    code = "idempotency_key_reused"

    def __init__(self, tenant: str, key: str, original_command_type: str):
        self.tenant = tenant
        self.key = key
        self.original_command_type = original_command_type
        super().__init__(
            f"idempotency key {key!r} (tenant {tenant!r}) was already used for a different "
            f"{original_command_type} request"
        )

    def details(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "key": self.key, "original_command_type": self.original_command_type}


class ConcurrencyConflict(CommitlineError):
    """The stream moved: ``expected`` is what the command assumed, ``actual`` what is stored."""

    code = "concurrency_conflict"

    def __init__(self, aggregate_id: UUID, expected: int | None, actual: int, attempts: int = 1):
        self.aggregate_id = aggregate_id
        self.expected = expected
        self.actual = actual
        self.attempts = attempts
        if expected is None:
            text = f"stream {aggregate_id} kept moving: gave up after {attempts} attempts (now at version {actual})"
        else:
            text = f"stream {aggregate_id} is at version {actual}, the command expected {expected}"
        super().__init__(text)

    def details(self) -> dict[str, Any]:
        return {
            "aggregate_id": str(self.aggregate_id),
            "expected_version": self.expected,
            "actual_version": self.actual,
            "attempts": self.attempts,
        }


class AggregateNotFound(CommitlineError):
    code = "aggregate_not_found"

    def __init__(self, aggregate_type: str, aggregate_id: UUID):
        self.aggregate_type = aggregate_type
        self.aggregate_id = aggregate_id
        super().__init__(f"no {aggregate_type} with id {aggregate_id}")

    def details(self) -> dict[str, Any]:
        return {"aggregate_type": self.aggregate_type, "aggregate_id": str(self.aggregate_id)}


class AggregateAlreadyExists(CommitlineError):
    code = "aggregate_already_exists"

    def __init__(self, aggregate_type: str, aggregate_id: UUID):
        self.aggregate_type = aggregate_type
        self.aggregate_id = aggregate_id
        super().__init__(f"a {aggregate_type} with id {aggregate_id} already exists")

    def details(self) -> dict[str, Any]:
        return {"aggregate_type": self.aggregate_type, "aggregate_id": str(self.aggregate_id)}


class WrongAggregateType(CommitlineError):
    code = "wrong_aggregate_type"

    def __init__(self, aggregate_id: UUID, expected: str, actual: str):
        self.aggregate_id = aggregate_id
        self.expected = expected
        self.actual = actual
        super().__init__(f"{aggregate_id} is a {actual}, not a {expected}")

    def details(self) -> dict[str, Any]:
        return {"aggregate_id": str(self.aggregate_id), "expected": self.expected, "actual": self.actual}


class ConfigurationError(CommitlineError):
    code = "configuration_error"

    def __init__(self, variable: str, reason: str):
        self.variable = variable
        self.reason = reason
        super().__init__(f"{variable}: {reason}")

    def details(self) -> dict[str, Any]:
        return {"variable": self.variable, "reason": self.reason}


class StoreUnavailable(CommitlineError):
    """The event store could not be reached; the command may be retried with the same key."""

    code = "store_unavailable"

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"event store unavailable: {reason}")

    def details(self) -> dict[str, Any]:
        return {"reason": self.reason}


__all__ = [
    "AggregateAlreadyExists",
    "AggregateNotFound",
    "CommitlineError",
    "ConcurrencyConflict",
    "ConfigurationError",
    "DomainError",
    "DuplicateReservation",
    "IdempotencyKeyReused",
    "IllegalTransition",
    "InsufficientStock",
    "InvalidCommand",
    "InvalidTenant",
    "InvalidValue",
    "MissingIdempotencyKey",
    "StoreUnavailable",
    "TaskClosed",
    "UnknownCommandType",
    "UnknownReservation",
    "UserNotIssued",
    "UsersAlreadyIssued",
    "WrongAggregateType",
]
