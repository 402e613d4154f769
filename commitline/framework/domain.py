"""``Domain``: the one object that collects a team's domain from its own package.

A domain holds aggregates (their state, events and transition table), the handler of each command
(which aggregate, whether its stream must be new, existing or either, how its id is found), the
domain's own errors with their HTTP statuses, read models and the queries over them, process managers
and the ports they call external systems through. Declarations are plain decorators and calls; nothing
is checked while they are made, so one mistake does not hide the next: ``check()`` (run by
``bootstrap`` before anything is written) reports every contradiction at once, each with the place it
was declared (``framework.checks``).

Everything the engine offers is derived from it: the event classes the store decodes, the commands
HTTP and the CLI accept and OpenAPI describes, Kafka topics, read models and their rebuilds, process
managers, the problem-document table, audit replay.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar, overload
from uuid import UUID

from commitline.application.catalog import CommandCatalog, Handler, Stream, target_field, with_loader
from commitline.application.commands import Command
from commitline.application.errors import InvalidDomain
from commitline.application.process import ProcessManager
from commitline.domain.aggregate import Aggregate
from commitline.domain.errors import DomainError
from commitline.domain.personal import personal_fields
from commitline.domain.registry import EventRegistry
from commitline.framework.checks import problems
from commitline.framework.declared import Declared, call_site, derived_id
from commitline.projections.base import Projection
from commitline.projections.reads import Reads

T = TypeVar("T")
C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Query:
    """A read over the read models, served at ``GET /v1/read-models/<path>``: ``function(reads, tenant, ...)``
    takes the path's parameters and the query's own (by name, typed), and returns JSON values; it raises
    ``AggregateNotFound`` for something the tenant does not have."""

    path: str
    function: Callable[..., Any]
    response: type | None = None
    summary: str = ""


@dataclass(frozen=True)
class PortContext:
    """What a port's factory may use to build its adapter: the settings (``gateway_url``, ``gateway_token``,
    ``gateway_timeout_s``, ...) and the database's connection parameters, ``psycopg.connect``'s keyword
    arguments (``psycopg.connect(**context.conninfo)``; secret: never print them). A factory that raises stops
    the process at start with a ``ConfigurationError`` naming the port and the line."""

    settings: Any
    conninfo: dict[str, Any] = field(repr=False)


PortFactory = Callable[[PortContext], Any]


class _Kind(Generic[T]):
    """A read-only attribute of a domain named after one kind of declaration: ``domain.handlers`` is
    ``domain.declared("handlers")``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.kind = name

    @overload
    def __get__(self, domain: None, owner: type) -> _Kind[T]: ...

    @overload
    def __get__(self, domain: Domain, owner: type | None = None) -> list[Declared[T]]: ...

    def __get__(self, domain: Domain | None, owner: type | None = None) -> _Kind[T] | list[Declared[T]]:
        return self if domain is None else domain.declared(self.kind)

    def __set__(self, domain: Domain, value: object) -> None:
        raise AttributeError(f"Domain.{self.kind} is read-only")


class Domain:
    """A team's domain: see the module docstring. ``schema`` is where its store lives by default (and its
    topics' prefix, ``<schema>.``), unless ``COMMITLINE_SCHEMA`` / ``COMMITLINE_KAFKA_TOPIC_PREFIX`` say
    otherwise; it defaults to the domain's name. ``demo`` is what ``commitline demo`` runs."""

    def __init__(self, name: str, *, schema: str | None = None, include: Iterable[Domain] = (),
                 demo: Callable[..., int] | None = None):
        self.name = name
        self.schema = schema or name
        self.where = call_site()
        self.demo = demo
        self.loaded_as: tuple[str, str | None] = ("bootstrap(domain=...)", None)  # how it was chosen, for errors
        self.parts: list[Domain] = []
        self._own: dict[str, list[Declared[Any]]] = {kind: [] for kind in _KINDS}
        self._checked_at = -1  # the declaration count when it was last checked
        for part in include:
            self.include(part)

    def __repr__(self) -> str:
        return f"Domain({self.name!r})"

    # -- declaring ---------------------------------------------------------------------

    def aggregate(self, cls: C) -> C:
        """Hold the aggregate class ``cls`` (its ``EVENTS`` and ``TRANSITIONS`` come with it); a decorator."""
        return self._add("aggregates", cls)

    def handles(self, command: type[Command], aggregate: type[Aggregate], stream: Stream = Stream.EXISTING, *,
                id: str | Callable[[Any], UUID | None] | None = None,  # noqa: A002 - reads as the domain's word
                internal: bool = False) -> Callable[[F], F]:
        """Decorate the handler of ``command``: ``handler(aggregate, command[, load]) -> Aggregate | None``.

        ``stream``: NEW (refused with AggregateAlreadyExists if it exists), EXISTING (AggregateNotFound if
        not) or ANY. ``id``: the command field holding the aggregate id, or a function of the command
        giving it; a None id (or no ``id`` for a NEW stream) is derived from the tenant and the
        idempotency key, so a retry creates the same aggregate. ``internal``: only the domain's process
        managers issue it; HTTP and the CLI never accept it."""
        where = call_site()
        target = _target(id)

        def register(function: F) -> F:
            handler = Handler(command, aggregate, stream, target, with_loader(function), internal, where)
            self._declare("handlers", handler, where)
            return function

        return register

    def error(self, cls: C) -> C:
        """Hold a ``DomainError`` subclass with its ``code`` and HTTP ``status``; a decorator."""
        return self._add("errors", cls)

    def read_model(self, cls: C) -> C:
        """Hold a read model (a ``Projection`` subclass: ``name``, ``tables``, ``@on`` handlers); a decorator."""
        return self._add("read_models", cls)

    def process_manager(self, cls: C) -> C:
        """Hold a process manager (a ``ProcessManager`` subclass); a decorator."""
        return self._add("process_managers", cls)

    def port(self, name: str, factory: PortFactory) -> None:
        """Declare the port ``name``: ``factory(context)`` builds its adapter (``context.settings``,
        ``context.conninfo``) when a process manager is built; process managers use it as ``self.ports[name]``."""
        self._declare("ports", (name, factory), call_site())

    def query(self, path: str, *, response: type | None = None, summary: str = "") -> Callable[[F], F]:
        """Decorate a read served at ``GET /v1/read-models/<path>`` (``{name}`` parts are parameters)."""
        where = call_site()

        def register(function: F) -> F:
            self._declare("queries", Query(path.strip("/"), function, response, summary), where)
            return function

        return register

    def reader(self, cls: C) -> C:
        """Hold the class of the domain's read-model queries (a ``Reads`` subclass); a decorator.
        ``app.read_models()`` returns one, and each ``query`` receives one."""
        return self._add("readers", cls)

    def include(self, other: Domain) -> Domain:
        """Hold everything ``other`` declares too, now and later (a domain made of parts, each in its own
        module, each with its own ``Domain``)."""
        if other is not self and other not in self.parts:
            self.parts.append(other)
            _DECLARATIONS[0] += 1
        return self

    def _add(self, kind: str, value: C) -> C:
        self._declare(kind, value, call_site(3))
        return value

    def _declare(self, kind: str, value: Any, where: str) -> None:
        self._own[kind].append(Declared(value, where))
        _DECLARATIONS[0] += 1

    def declared(self, kind: str) -> list[Declared[Any]]:
        """What this domain and its parts declare of ``kind`` (``aggregates``, ``handlers``, ...), in order."""
        out = list(self._own[kind])
        for part in self.parts:
            out.extend(part.declared(kind))
        return out

    aggregates: _Kind[type[Aggregate]] = _Kind()
    handlers: _Kind[Handler] = _Kind()
    errors: _Kind[type[DomainError]] = _Kind()
    read_models: _Kind[type[Projection]] = _Kind()
    process_managers: _Kind[type[ProcessManager]] = _Kind()
    ports: _Kind[tuple[str, PortFactory]] = _Kind()
    queries: _Kind[Query] = _Kind()
    readers: _Kind[type[Reads]] = _Kind()

    # -- using ---------------------------------------------------------------------------

    def check(self) -> Domain:
        """Raise InvalidDomain listing every contradiction among the declarations (with where each is
        declared); return the domain when there is none."""
        if self._checked_at != _DECLARATIONS[0]:
            found = problems(self)
            if found:
                raise InvalidDomain(domain=self.name, problems=found)
            for name in ("registry", "catalog", "projections", "personal_projections", "managers", "error_statuses",
                         "port_factories", "reads_class"):
                self.__dict__.pop(name, None)
            self._checked_at = _DECLARATIONS[0]
        return self

    @functools.cached_property
    def registry(self) -> EventRegistry:
        return EventRegistry(_unique(d.value for d in self.aggregates))

    @functools.cached_property
    def catalog(self) -> CommandCatalog:
        return CommandCatalog(d.value for d in self.handlers)

    @functools.cached_property
    def projections(self) -> Mapping[str, type[Projection]]:
        return MappingProxyType({d.value.name: d.value for d in self.read_models})

    @functools.cached_property
    def has_personal_fields(self) -> bool:
        """Whether an event of the domain has a ``Personal`` field (sealed under its data subject's key)."""
        return any(personal_fields(event) for event in self.registry.event_types.values())

    @functools.cached_property
    def personal_projections(self) -> Mapping[str, tuple[str, ...]]:
        """The read models that may copy personal values into their rows, each with the personal fields its
        handlers receive (``"CustomerRegistered.email"``): every projection handling an event type with a
        ``Personal`` field, unless it declares ``copies_personal_data = False``. Erasing a subject rebuilds them."""
        found = {}
        for name, projection in self.projections.items():
            fields = sorted(f"{event.__name__}.{field}" for event in projection._handlers
                            for field, _ in personal_fields(event))
            if fields and projection.copies_personal_data:
                found[name] = tuple(fields)
        return MappingProxyType(dict(sorted(found.items())))

    @functools.cached_property
    def managers(self) -> Mapping[str, type[ProcessManager]]:
        return MappingProxyType({d.value.name: d.value for d in self.process_managers})

    @functools.cached_property
    def error_statuses(self) -> Mapping[str, int]:
        """The HTTP status of each of the domain's error codes."""
        return MappingProxyType({d.value.code: int(d.value.status) for d in self.errors
                                 if d.value.status is not None})

    @functools.cached_property
    def port_factories(self) -> Mapping[str, PortFactory]:
        return MappingProxyType({name: factory for name, factory in (d.value for d in self.ports)})

    @functools.cached_property
    def reads_class(self) -> type[Reads]:
        return self.readers[-1].value if self.readers else Reads


_DECLARATIONS = [0]  # every declaration of every domain counts: a domain is checked again after any
_KINDS = ("aggregates", "handlers", "errors", "read_models", "process_managers", "ports", "queries", "readers")


def _target(id: str | Callable[[Any], UUID | None] | None) -> Callable[[Any], UUID | None]:  # noqa: A002
    if id is None:
        return derived_id
    if isinstance(id, str):
        return target_field(id)
    return id


def _unique(values: Iterable[T]) -> list[T]:
    return list(dict.fromkeys(values))
