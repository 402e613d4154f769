"""What a domain's commands do: for each command class, the aggregate it changes, whether its stream
must be new, existing or either, how its target id is found, and the handler that decides.

A handler receives the loaded aggregate (blank when its stream is empty), the command and, if it takes
a third argument, a loader for reading other, existing aggregates of the command's tenant (it raises
AggregateNotFound for one that does not exist or belongs to another tenant). It calls the aggregate's
command methods and returns the aggregate holding the new events (None: the one it was given).
Loading, tenancy, concurrency and idempotency are the processor's job.

An ``internal`` command is issued only by the domain's process managers (from Python): it is never
accepted as a mapping or JSON, so neither HTTP nor the CLI can send it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any
from uuid import UUID

from commitline.application.commands import Command
from commitline.domain.aggregate import Aggregate

Loader = Callable[[type[Aggregate], UUID], Aggregate]


class Stream(Enum):
    NEW = "the stream must be empty"
    EXISTING = "the stream must already exist"
    ANY = "either"


@dataclass(frozen=True)
class Handler:
    """One command's handling: ``target(command)`` is the id of the stream it changes (None: an id derived
    from the tenant and the idempotency key); ``run(aggregate, command, load)`` decides."""

    command: type[Command]
    aggregate: type[Aggregate]
    stream: Stream
    target: Callable[[Any], UUID | None]
    run: Callable[[Any, Any, Loader], Aggregate]
    internal: bool = False
    declared_at: str = field(default="", compare=False)


def target_field(name: str) -> Callable[[Any], UUID | None]:
    """The target of a command whose ``name`` field holds the aggregate id."""
    def target(command: Any) -> UUID | None:
        return getattr(command, name)

    target.__qualname__ = f"field {name!r}"
    return target


def handler_arity(function: Callable[..., Any]) -> int | None:
    """How many positional arguments a handler ``function`` is called with: 3 (aggregate, command, loader) when
    its signature binds three, else 2 when it binds two (a keyword-only parameter is not the loader), None when
    it binds neither. 3 when there is no signature to read."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return 3
    for arity in (3, 2):
        try:
            signature.bind(*[None] * arity)
            return arity
        except TypeError:
            continue
    return None


def with_loader(function: Callable[..., Aggregate | None]) -> Callable[[Any, Any, Loader], Aggregate]:
    """A handler called as ``(aggregate, command, load)``, whether ``function`` takes the loader or only the
    first two (``handler_arity``); returning None means the aggregate it was given."""
    if handler_arity(function) != 2:
        def run(aggregate: Any, command: Any, load: Loader) -> Aggregate:
            changed = function(aggregate, command, load)
            return aggregate if changed is None else changed
    else:
        def run(aggregate: Any, command: Any, load: Loader) -> Aggregate:
            changed = function(aggregate, command)
            return aggregate if changed is None else changed

    run.__wrapped__ = function  # type: ignore[attr-defined]
    return run


class CommandCatalog:
    """A domain's commands and their handlers; ``public`` are those accepted from outside, by type."""

    def __init__(self, handlers: Iterable[Handler]):
        self.handlers: Mapping[type[Command], Handler] = MappingProxyType({h.command: h for h in handlers})
        self.public: Mapping[str, type[Command]] = MappingProxyType(
            {cls.type_name(): cls for cls, h in self.handlers.items() if not h.internal})
        self.known_types = frozenset(cls.type_name() for cls in self.handlers)

    def handler(self, command: type[Command]) -> Handler:
        return self.handlers[command]

    def holds(self, command: type[Command]) -> bool:
        return command in self.handlers

    def public_types(self) -> list[str]:
        return sorted(self.public)
