"""Every typed error (a ``CommitlineError``) commitline itself raises, importable from this one module:
the refusals every domain shares, command, configuration and store errors, and audit-query errors. A
domain's own refusals are ``DomainError`` subclasses declared by the domain.

Each carries ``code`` (stable, machine-readable), ``details()`` (fields) and ``to_dict()``.
Whenever one of these is raised by ``CommandProcessor.dispatch``, nothing was written, except
``StoreUnavailable`` after a connection lost during COMMIT: retrying with the same key tells.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from commitline.domain.errors import CommitlineError, DomainError, IllegalTransition, InvalidValue


def printable(value: object, limit: int = 100) -> str:
    """``value`` as text that is safe to show and to encode as JSON: printable text as it is, anything
    else as its ``repr`` (which escapes control characters and lone surrogates); at most ``limit`` characters."""
    text = value if isinstance(value, str) and value.isprintable() else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def joined(field: str, item: Callable[[Any], str] = str, separator: str = "; ") -> property:
    """A part of an error's message made of its ``field``: each of its items as ``item`` gives it, joined."""
    return property(lambda error: separator.join(map(item, getattr(error, field))))


def at_location(whole: str = "") -> Callable[[dict[str, Any]], str]:
    """A validation problem (``loc``, ``msg``) as ``path.to.field: msg``; ``whole`` names an empty ``loc``."""
    return lambda problem: f"{'.'.join(map(str, problem['loc'])) or whole}: {problem['msg']}"


def _article(name: object) -> str:
    """The indefinite article before a type's name in a message: "an Order", "a Payment"."""
    return "an" if str(name)[:1].upper() in "AEIOU" and str(name)[:1] else "a"


class InvalidCommand(CommitlineError):
    """The command failed validation; ``errors`` lists each problem: ``loc`` (the path to the field:
    keys and list indexes, ``[]`` for the command as a whole), ``msg`` and ``type``."""

    code = "invalid_command"
    fields = ("command_type", "errors")
    message = "invalid {subject}: {summary}"

    subject = property(lambda error: error.command_type or "command")
    summary = joined("errors", at_location("<command>"))

    @property
    def not_json(self) -> bool:
        """Whether the command was not JSON at all (a malformed request, not an invalid command: HTTP answers 400
        ``malformed_json``, and the metrics count it under that code)."""
        errors = self.errors
        return bool(errors) and all(isinstance(e, dict) and e.get("type") in ("json_invalid", "json_invalid_utf8")
                                    for e in errors)


class UnknownCommandType(CommitlineError):
    """The command's ``type`` names no command the domain accepts; ``known`` lists those it does."""

    code = "unknown_command_type"
    fields = ("command_type", "known")
    text_fields = ("command_type",)
    known_types = property(lambda error: ", ".join(error.known) or "none (the domain takes no command from outside)")

    @property
    def message(self) -> str:  # type: ignore[override]
        if self.command_type is None:
            return 'the command names no type (its "type" field); known types: {known_types}'
        if not isinstance(self.command_type, str):  # shown as the JSON it came as, not as Python's repr
            return 'the command\'s "type" is {shown_type}, not a string; known types: {known_types}'
        return "unknown command type {command_type!r}; known types: {known_types}"

    def details(self) -> dict[str, Any]:
        out = super().details()
        if self.command_type is not None and not isinstance(self.command_type, str):
            out["command_type"] = self.shown_type
        return out

    @property
    def shown_type(self) -> str:
        try:
            return printable(json.dumps(self.command_type, ensure_ascii=False, default=str), 100)
        except (TypeError, ValueError):
            return printable(repr(self.command_type), 100)


class InternalCommandType(UnknownCommandType):
    """The command's ``type`` is one of the domain's internal commands, which only its process managers issue (or
    Python code passing the command object): never accepted as JSON or a mapping. Its code is that of an unknown
    type: to the caller, the domain takes no such command."""

    @property
    def message(self) -> str:  # type: ignore[override]
        return ("{command_type!r} is an internal command of the domain: only its process managers, or Python code "
                "passing the command object itself, issue it, never JSON or a mapping; known types: {known_types}")


class MissingIdempotencyKey(CommitlineError):
    """A state-changing command came without an idempotency key."""

    code = "missing_idempotency_key"
    fields = ("command_type", "reason")
    reason = "state-changing commands require an idempotency key"
    message = "{command_type}: {reason}"


class InvalidIdempotencyKey(MissingIdempotencyKey):
    """A key was given but cannot be used (``reason`` says why); a kind of missing key."""

    code = "invalid_idempotency_key"
    reason = "the idempotency key is not usable"


class InvalidTenant(CommitlineError):
    """``tenant`` is shown escaped and shortened (``printable``), never as the raw input."""

    code = "invalid_tenant"
    fields = ("tenant",)
    message = "tenant {shown} must be 1-64 characters of letters, digits, '.', '_' or '-'"
    shown = property(lambda error: printable(repr(error.tenant)))

    def details(self) -> dict[str, Any]:
        return {"tenant": printable(self.tenant)}


class IdempotencyKeyReused(CommitlineError):
    """The key was already used for a different request; the earlier outcome stands. ``original_command_type``
    is the type of the request that used it, ``command_type`` that of this one."""

    code = "idempotency_key_reused"
    fields = ("tenant", "key", "original_command_type", "command_type")
    command_type = None

    @property
    def message(self) -> str:  # type: ignore[override]
        if self.command_type in (None, self.original_command_type):
            return ("idempotency key {key!r} (tenant {tenant!r}) was already used for a different "
                    "{original_command_type} request")
        return ("idempotency key {key!r} (tenant {tenant!r}) was already used for {original_command_type_article} "
                "{original_command_type} request, not this {command_type}")

    original_command_type_article = property(lambda error: _article(error.original_command_type))


class ConcurrencyConflict(CommitlineError):
    """The stream moved: its details' ``expected_version`` is the version the command assumed (null when it gave
    none and the stream kept moving through every attempt), ``actual_version`` the stream's version now
    (the exception's ``expected`` and ``actual``)."""

    code = "concurrency_conflict"
    fields = ("aggregate_id", "expected", "actual", "attempts")
    attempts = 1

    @property
    def message(self) -> str:  # type: ignore[override]
        if self.expected is None:
            return "stream {aggregate_id} kept moving: gave up after {attempts} attempts (now at version {actual})"
        return "stream {aggregate_id} is at version {actual}, the command expected {expected}"

    def details(self) -> dict[str, Any]:
        return {
            "aggregate_id": str(self.aggregate_id),
            "expected_version": self.expected,
            "actual_version": self.actual,
            "attempts": self.attempts,
        }


class AggregateNotFound(CommitlineError):
    """No aggregate of the type with that id, in the caller's tenant (another tenant's is not found either)."""

    code = "aggregate_not_found"
    fields = ("aggregate_type", "aggregate_id")
    text_fields = ("aggregate_id",)
    message = "no {aggregate_type} with id {aggregate_id}"


class AggregateAlreadyExists(CommitlineError):
    """A command that creates a stream named an id that is already taken."""

    code = "aggregate_already_exists"
    fields = ("aggregate_type", "aggregate_id")
    text_fields = ("aggregate_id",)
    message = "{article} {aggregate_type} with id {aggregate_id} already exists"

    article = property(lambda error: _article(error.aggregate_type))


class WrongAggregateType(CommitlineError):
    """The id names a stream of another aggregate type than the command acts on."""

    code = "wrong_aggregate_type"
    fields = ("aggregate_id", "expected", "actual")
    text_fields = ("aggregate_id",)
    message = "{aggregate_id} is {actual_article} {actual}, not {expected_article} {expected}"

    actual_article = property(lambda error: _article(error.actual))
    expected_article = property(lambda error: _article(error.expected))


class EventTooLarge(CommitlineError):
    """The command would store an event above ``COMMITLINE_MAX_EVENT_BYTES``; nothing was written."""

    code = "event_too_large"
    fields = ("command_type", "event_type", "size", "limit")
    message = ("{command_type} would store a {event_type} event of {size} bytes, above the limit of {limit} "
               "(COMMITLINE_MAX_EVENT_BYTES); nothing was written")


class EventNotStorable(CommitlineError):
    """The command would store an event with a value its JSON cannot hold (an integer beyond 64 bits, bytes, an
    object of no JSON form); nothing was written."""

    code = "event_not_storable"
    fields = ("command_type", "event_type", "field", "reason")
    message = ("{command_type} would store a {event_type} event whose field {field} cannot be stored as JSON "
               "({reason}); nothing was written")


class ConfigurationError(CommitlineError):
    """A setting is missing or unusable (an environment variable, a flag, the database's schema version); nothing
    was done."""

    code = "configuration_error"
    fields = ("variable", "reason")
    message = "{variable}: {reason}"


class InvalidApp(ConfigurationError):
    """``--app`` / ``COMMITLINE_APP`` does not name a usable domain: not ``module:attribute``, a module that
    does not import, an attribute it lacks, or something that is not a ``Domain``."""

    code = "invalid_app"
    fields = ("variable", "spec", "reason")
    variable = "COMMITLINE_APP"
    message = "{variable} {spec!r}: {reason}"


class InvalidDomain(ConfigurationError):
    """A domain whose declarations contradict each other; ``problems`` lists each, with where it is declared."""

    code = "invalid_domain"
    fields = ("variable", "domain", "problems", "spec")
    variable = "COMMITLINE_APP"
    spec = None  # the ``module:attribute`` it was loaded by, when it was

    @property
    def message(self) -> str:  # type: ignore[override]  # a template: the braces of a problem's text are its own
        count = len(self.problems)
        lines = "".join(f"\n  - {p}" for p in self.problems)
        source = f"{self.variable} {self.spec!r}: " if self.spec else ""
        text = f"{source}domain {self.domain!r} cannot be used: {count} problem{'s' if count != 1 else ''}:{lines}"
        return text.replace("{", "{{").replace("}", "}}")


class WrongMasterKey(ConfigurationError):
    """The configured master key (``COMMITLINE_MASTER_KEY``) cannot unwrap a data key: another master key
    wrapped it. Nothing was written. The message names key ids only, never key material."""

    code = "wrong_master_key"
    variable = "COMMITLINE_MASTER_KEY"


class StoreUnavailable(CommitlineError):
    """The event store could not be reached or used (refused or lost connection, no pooled connection
    within ``COMMITLINE_POOL_TIMEOUT_S``); retry with the same key. The command was not applied, or,
    if the connection died during its COMMIT, may have been: the retry then returns its outcome."""

    code = "store_unavailable"
    fields = ("reason",)
    message = "event store unavailable: {reason}"


class Closed(CommitlineError):
    """This application was closed (``close()``, or the end of its ``with`` block): nothing more is dispatched or
    read through it. A command in flight as it closed may have been applied: dispatch it again, with the same
    idempotency key, through an open one, which answers either way."""

    code = "closed"
    fields = ()
    message = ("this commitline application is closed: dispatch or read through an open one (bootstrap); a command "
               "in flight as it closed may have been applied, so retry it with the same idempotency key")

    def __init__(self) -> None:
        super().__init__(self.message)


class UnexpectedFailure(CommitlineError):
    """One command of a batch (``dispatch_many``) failed with an exception that is no commitline error: a defect,
    in the domain's code most likely (its traceback is logged; the message names only its type). The others'
    outcomes are returned as usual. It was not applied, unless it failed after its commit: a retry with the same
    idempotency key, once the cause is fixed, answers either way."""

    code = "internal_error"
    fields = ("command_type", "exception")
    message = ("{command_type}: failed unexpectedly with {exception} (the log has its traceback); retry with the "
               "same idempotency key once the cause is fixed")


class AuditQueryError(CommitlineError):
    """An audit question that cannot be answered as asked (raised by ``application.audit``)."""

    code = "audit_query_error"

    def __init__(self, message: str, **details: Any):
        self._details = details
        super().__init__(message)

    def details(self) -> dict[str, Any]:  # numbers stay numbers (a version, the head); times and ids as text
        return {k: v if v is None or isinstance(v, float) or (isinstance(v, int) and abs(v) < 2**63) else str(v)
                for k, v in self._details.items()}


class VersionBeyondHead(AuditQueryError):
    """An audit query asked for a version the stream has not reached."""

    code = "version_beyond_head"


class BeforeCreation(AuditQueryError):
    """An audit query asked for a stream's state at a time before its first event."""

    code = "before_creation"


class HistoryBroken(CommitlineError):
    """A stream's stored events cannot be replayed as a history (a version missing or out of place, an event
    that does not decode): a fault of the store, not of the question; ``audit verify`` names what is wrong."""

    code = "history_broken"
    fields = ("aggregate_id", "reason")
    text_fields = ("aggregate_id",)
    message = ("the stored history of {aggregate_id} cannot be replayed: {reason}; run `commitline audit verify "
               "--aggregate {aggregate_id} --tenant TENANT` (the stream's tenant; `--all` checks every tenant's)")


__all__ = [
    "AggregateAlreadyExists",
    "AggregateNotFound",
    "AuditQueryError",
    "BeforeCreation",
    "CommitlineError",
    "ConcurrencyConflict",
    "ConfigurationError",
    "DomainError",
    "EventTooLarge",
    "HistoryBroken",
    "IdempotencyKeyReused",
    "IllegalTransition",
    "InvalidApp",
    "InvalidCommand",
    "InvalidDomain",
    "InvalidIdempotencyKey",
    "InvalidTenant",
    "InvalidValue",
    "MissingIdempotencyKey",
    "StoreUnavailable",
    "UnknownCommandType",
    "VersionBeyondHead",
    "WrongAggregateType",
]
