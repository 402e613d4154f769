"""Every way a domain's declarations can contradict each other, found at once, each with where it is declared.

``problems(domain)`` returns one line per problem (``path:line: what is wrong``); ``Domain.check`` raises
them together in one ``InvalidDomain``, before anything is written. Checked here:

- aggregates: each an ``Aggregate`` subclass with events, ``_evolve`` and a sound transition table on a
  field it has; no two with one name (the name is the Kafka topic and the stored aggregate type);
- events: each an ``Event`` subclass of one aggregate only, type names unique, an upcaster for every
  step from version 1 to ``class_version``; each personal field (``Personal``) tied to a subject that is
  another field of the event or an attribute of its aggregate;
- commands: each a ``Command`` subclass with one handler, type names unique, its aggregate held by the
  domain, its id field present;
- errors: ``DomainError`` subclasses with their own code (unique, not one of commitline's) and an HTTP
  status from 400 to 599;
- read models: ``Projection`` subclasses with a unique name and tables no other read model declares,
  handling only events the domain's aggregates emit;
- process managers: ``ProcessManager`` subclasses with a unique name, not a follower name commitline or a
  read model uses, triggered only by the domain's events; ports named once; queries at distinct paths.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import linecache
import re
import string
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, MutableSequence, MutableSet, Sequence
from collections.abc import Set as AbstractSet
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from types import UnionType
from typing import Any, ClassVar, Literal, Protocol, TypeVar, Union, get_args, get_origin, get_type_hints, is_typeddict
from uuid import UUID

from pydantic import BaseModel, TypeAdapter

from commitline.application.commands import Command
from commitline.application.process import ProcessManager
from commitline.domain.aggregate import Aggregate, Event
from commitline.domain.errors import DomainError
from commitline.domain.personal import personal_fields
from commitline.domain.registry import EventRegistry
from commitline.application.catalog import Handler, Stream, handler_arity
from commitline.framework.declared import Declared, derived_id, shown_path
from commitline.projections.base import Projection, Table
from commitline.projections.reads import Reads
from commitline.infrastructure.migrations import STORE_TABLES
from commitline.infrastructure.schema_names import schema_name_problem
from commitline.projections.storage import REBUILD_SUFFIX, base_type


class Domain(Protocol):
    """What the checks read of a ``framework.domain.Domain``: its names and its declarations of each kind (a
    protocol, so this module does not import the one that calls it)."""

    name: str
    schema: str
    where: str

    @property
    def aggregates(self) -> list[Declared[type[Aggregate]]]: ...
    @property
    def handlers(self) -> list[Declared[Handler]]: ...
    @property
    def errors(self) -> list[Declared[type[DomainError]]]: ...
    @property
    def read_models(self) -> list[Declared[type[Projection]]]: ...
    @property
    def process_managers(self) -> list[Declared[type[ProcessManager]]]: ...
    @property
    def ports(self) -> list[Declared[tuple[str, Any]]]: ...
    @property
    def queries(self) -> list[Declared[Any]]: ...
    @property
    def readers(self) -> list[Declared[type[Reads]]]: ...
    @property
    def registry(self) -> EventRegistry: ...

NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
MAX_TABLE_NAME = 63 - len(REBUILD_SUFFIX)
NOT_NUMBERS = frozenset({"text", "varchar", "character varying", "char", "character", "uuid", "boolean", "bool",
                         "json", "jsonb", "date", "timestamp", "timestamptz", "time", "timetz", "interval", "bytea",
                         "inet", "cidr"})  # column types a counter cannot add to
QUERY_PATH = re.compile(r"(?:[A-Za-z0-9_.~-]+|{[A-Za-z_]\w*})(?:/(?:[A-Za-z0-9_.~-]+|{[A-Za-z_]\w*}))*")
TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,%d}$" % (MAX_TABLE_NAME - 1))
#: codes commitline itself answers with; a domain error may not take one
CORE_CODES = frozenset({
    "error", "domain_error", "illegal_transition", "invalid_value", "invalid_command", "unknown_command_type",
    "missing_idempotency_key", "invalid_idempotency_key", "invalid_tenant", "idempotency_key_reused",
    "concurrency_conflict", "aggregate_not_found", "aggregate_already_exists", "wrong_aggregate_type",
    "event_too_large", "configuration_error", "wrong_master_key", "invalid_app", "invalid_domain", "store_unavailable",
    "audit_query_error", "version_beyond_head", "before_creation", "malformed_json", "invalid_query",
    "unauthorized", "not_found", "method_not_allowed", "body_too_large", "unsupported_media_type", "not_ready",
    "internal_error", "closed", "history_broken",
})
#: follower names commitline uses itself (with the aliases ``status --check`` accepts)
CORE_FOLLOWERS = frozenset({"kafka-publisher", "publisher", "sagas"})


@functools.lru_cache(maxsize=None)
def _source_line(obj: Any) -> str | None:
    try:
        path = inspect.getsourcefile(obj)
        line = (_class_line(obj, path) if isinstance(obj, type) and path else None) or inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return None
    return f"{shown_path(path)}:{line}" if path else None


def _class_line(cls: type, path: str) -> int | None:
    """The line of ``class Name`` for this class itself: ``inspect`` finds the first class of its name in the
    file, the wrong one for a second class of that name (the very case "two aggregates are named ..." reports).
    Python 3.13 records it; before, it is the nearest ``class Name`` above the first of the class's own methods."""
    recorded = getattr(cls, "__firstlineno__", None)
    if isinstance(recorded, int):
        return recorded
    starts = [f.__code__.co_firstlineno for f in (getattr(v, "__func__", v) for v in vars(cls).values())
              if hasattr(f, "__code__") and f.__code__.co_filename == path]
    if not starts:
        return None
    header = re.compile(rf"\s*class\s+{re.escape(cls.__name__)}\b")
    for line in range(min(starts) - 1, 0, -1):
        if header.match(linecache.getline(path, line)):
            return line
    return None


class _Where:
    """``file:line`` where a class or function is defined, found when a problem is told (``str``, an f-string):
    finding it parses the source file (``inspect.getsourcelines``), about 4 ms a class, and a domain without
    problems never needs it, so every process would pay it at start for nothing."""

    __slots__ = ("obj", "fallback")

    def __init__(self, obj: Any, fallback: Any):
        self.obj, self.fallback = obj, fallback

    def __str__(self) -> str:
        try:
            return _source_line(self.obj) or str(self.fallback)
        except TypeError:  # unhashable
            return str(self.fallback)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def where_defined(obj: Any, fallback: Any) -> Any:
    """Where a class or function is defined, as ``file:line`` once formatted; ``fallback`` when the source
    cannot be found."""
    return _Where(obj, fallback)


def problems(domain: Domain) -> list[str]:
    found: list[str] = []

    def say(where: str, text: str) -> None:
        found.append(f"{where}: {text}")

    if (wrong := schema_name_problem(domain.schema)) is not None:
        say(domain.where, f"the domain's schema {domain.schema!r} {wrong} (give Domain(..., schema=...) with "
            "another name)")
    aggregates = _aggregates(domain, say)
    events = _events(aggregates, say)
    _personal(events, aggregates, say)
    _commands(domain, aggregates, say)
    _errors(domain, say)
    _read_models(domain, events, say)
    _process_managers(domain, events, say)
    _ports_and_queries(domain, say)
    return sorted(found, key=_place)


def _place(problem: str) -> tuple[str, int, str]:
    """A problem's file and line, to list problems in the order they are declared."""
    path, _, rest = problem.partition(":")
    line, _, _ = rest.partition(":")
    return (path, int(line) if line.isdigit() else 0, problem)


def _subclasses(declared: Iterable[Declared[Any]], base: type, say: Any) -> Iterator[tuple[Any, str]]:
    """Each declared class (once, however often it is held) that subclasses ``base``, with where it is
    defined; anything else is reported."""
    for d in _unique_declared(declared):
        cls = d.value
        if not (isinstance(cls, type) and issubclass(cls, base)) or cls is base:
            say(d.where, f"{cls!r} is not a {base.__name__} subclass")
            continue
        yield cls, where_defined(cls, d.where)


def _aggregates(domain: Domain, say: Any) -> dict[type[Aggregate], str]:
    held: dict[type[Aggregate], str] = {}
    by_name: dict[str, list[str]] = defaultdict(list)
    for cls, where in _subclasses(domain.aggregates, Aggregate, say):
        held[cls] = where
        by_name[cls.__name__].append(where)
        if not cls.EVENTS:
            say(where, f"aggregate {cls.__name__} declares no EVENTS")
        if cls._evolve is Aggregate._evolve:
            say(where, f"aggregate {cls.__name__} does not implement _evolve(event)")
        _own_names(cls, where, say)
        _machine(cls, where, say)
    for name, places in by_name.items():
        for place in places[1:]:
            say(place, f"two aggregates are named {name} (also {places[0]}): the name is the stored aggregate "
                "type and the Kafka topic")
    return held


#: What an aggregate class declares for commitline to read (the rest of the base's names are commitline's own)
AGGREGATE_HOOKS = frozenset({"EVENTS", "TRANSITIONS", "MACHINE", "_evolve", "blank"})
#: The base's names an aggregate must not redefine: its methods, its fields ``id`` and ``version``, and the
#: attribute holding its pending events
AGGREGATE_OWN = frozenset({*(n for n in vars(Aggregate) if not n.startswith("__")), "id", "version",
                           "_pending_events"}) - AGGREGATE_HOOKS


def _own_names(cls: type[Aggregate], where: str, say: Any) -> None:
    """An aggregate's field or method with the name of one of commitline's own (``apply``, ``replay``, ``version``
    ...) would replace it: every command on the aggregate would then fail, far from the cause. And a field
    without a default: the aggregate before its first event (``blank``) is made of the fields' defaults."""
    declared = set()
    for klass in cls.__mro__[:cls.__mro__.index(Aggregate)]:
        declared |= {n for n in vars(klass) if not n.startswith("__")} | set(vars(klass).get("__annotations__", {}))
    clashes = declared & AGGREGATE_OWN
    if cls.__dataclass_fields__["id"].type in (UUID, "UUID"):  # the id declared again, as it is: harmless
        clashes.discard("id")
    if clashes:
        names = ", ".join(sorted(clashes))
        say(where, f"aggregate {cls.__name__} defines {names}, which {'are' if len(clashes) > 1 else 'is'} "
            f"commitline's own (Aggregate's, used to apply events and keep the stream's version): name "
            f"{'them' if len(clashes) > 1 else 'it'} otherwise")
    if cls.blank.__func__ is Aggregate.blank.__func__:  # type: ignore[attr-defined]
        for f in dataclasses.fields(cls):
            if f.name != "id" and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                say(where, f"aggregate {cls.__name__}'s field {f.name} has no default: the aggregate before its "
                    "first event is made of its fields' defaults (give it one, e.g. None, or field(default_factory="
                    "...) for a list or dict)")


def _machine(cls: type[Aggregate], where: str, say: Any) -> None:
    table = cls.TRANSITIONS
    if table is None:
        if cls.MACHINE is not None:
            say(where, f"aggregate {cls.__name__} names a MACHINE but has no TRANSITIONS table")
        return
    for problem in table.problems():
        say(where, f"aggregate {cls.__name__}'s transition table: {problem}")
    machine = cls.machine()
    assert machine is not None
    fields = {f.name: f for f in cls.__dataclass_fields__.values()}
    if machine[1] not in fields:
        say(where, f"aggregate {cls.__name__} has no field {machine[1]!r} to hold its machine's state "
            "(set MACHINE to the field that does)")
        return
    enum = table.enum
    annotation = fields[machine[1]].type
    if isinstance(annotation, str):  # the module has ``from __future__ import annotations``
        per_entry = annotation.replace(" ", "").startswith(("dict[", "Mapping[", "dict"))
        other = enum is not None and not per_entry and enum.__name__ not in annotation
        shown = annotation
    else:
        per_entry = get_origin(annotation) in (dict, Mapping)
        other = enum is not None and not per_entry and enum not in (get_args(annotation) or (annotation,))
        shown = " | ".join("None" if a is type(None) else getattr(a, "__name__", str(a))
                           for a in (get_args(annotation) or (annotation,)))
    if other:
        say(where, f"aggregate {cls.__name__}'s field {machine[1]} is {shown}, but its transition table's "
            f"states are {enum.__name__} members")


def _events(aggregates: dict[type[Aggregate], str], say: Any) -> dict[type[Event], type[Aggregate]]:
    owner: dict[type[Event], type[Aggregate]] = {}
    by_name: dict[str, list[str]] = defaultdict(list)
    for cls, where in aggregates.items():
        for event in cls.EVENTS:
            if not (isinstance(event, type) and issubclass(event, Event)):
                say(where, f"aggregate {cls.__name__}'s EVENTS holds {event!r}, not an Event subclass")
                continue
            if event in owner and owner[event] is not cls:
                say(where, f"event {event.__name__} is emitted by both {owner[event].__name__} and {cls.__name__}: "
                    "an event belongs to one aggregate")
                continue
            if event in owner:
                continue
            owner[event] = cls
            event_where = where_defined(event, where)
            by_name[event.type_name()].append(event_where)
            if not isinstance(event.class_version, int) or event.class_version < 1:
                say(event_where, f"event {event.__name__}'s class_version must be a whole number from 1, not "
                    f"{event.class_version!r}")
                continue
            declared = set().union(*map(inspect.get_annotations, event.__mro__[:event.__mro__.index(Event)]))
            envelope = sorted(Event.ENVELOPE & declared)
            if envelope:
                say(event_where, f"event {event.__name__} declares {', '.join(envelope)}, which every event has "
                    f"already ({', '.join(sorted(Event.ENVELOPE))}, set when it is emitted): name the field otherwise")
            for field, key in _non_string_keys(event):
                say(event_where, f"event {event.__name__}'s field {field} holds a dict keyed by {key}: an event is "
                    "stored as JSON, whose object keys are strings; key it by str")
            for field, kind in _unstorable_fields(event):
                say(event_where, f"event {event.__name__}'s field {field} holds {kind}, which an event's JSON cannot "
                    "store and read back: use str, int, float, bool, Decimal, UUID, datetime, date, time, an Enum, "
                    "a dataclass of such fields, or lists, tuples, sets and str-keyed dicts of them")
            missing = event.missing_upcasters()
            if missing:
                say(event_where, f"event {event.__name__}'s upcaster chain has a hole: it is at class_version "
                    f"{event.class_version} and lacks {', '.join(missing)}")
            beyond = [f"upcast_v{v}_v{v + 1}" for v in event.upcasters() if v >= event.class_version]
            if beyond:
                say(event_where, f"event {event.__name__} has {', '.join(beyond)}, beyond its class_version "
                    f"{event.class_version} (raise class_version to the version they produce)")
    for name, places in by_name.items():
        for place in places[1:]:
            say(place, f"two events have the type name {name} (also {places[0]})")
    return owner


def _non_string_keys(event: type[Event]) -> Iterator[tuple[str, str]]:
    """Each field of ``event`` holding (anywhere in its type) a dict whose keys are not strings, with the key's
    type: JSON cannot store it (the encoder refuses it on every command)."""
    try:
        hints = get_type_hints(event)
    except Exception:  # a name the module cannot resolve: the class is checked no further here
        return
    for field in _field_names(event):
        stack = [hints.get(field)]
        while stack:
            annotation = stack.pop()
            args = get_args(annotation)
            if get_origin(annotation) in (dict, Mapping, MutableMapping) and args and not _string_like(args[0]):
                yield field, getattr(args[0], "__name__", None) or str(args[0])
                break
            stack.extend(a for a in args if a is not Ellipsis)


#: What an event's JSON holds and reads back to the same type (``infrastructure/store/codec``): orjson's own types
#: (their subclasses too: a str or int Enum, a NewType), Decimal (as text); containers and dataclasses of them.
_STORABLE = (str, int, float, bool, type(None), Decimal, UUID, datetime, date, time, Enum)
_CONTAINERS = (list, tuple, set, frozenset, dict, Sequence, MutableSequence, AbstractSet, MutableSet, Mapping,
               MutableMapping)


def _unstorable_fields(event: type[Event]) -> Iterator[tuple[str, str]]:
    """Each field of ``event`` whose type holds (anywhere) a type the store's JSON cannot hold, with that type's
    name: bytes, a timedelta, a pydantic model, any other class. ``Any`` and ``object`` pass: their values are
    checked as each event is stored (``EventNotStorable``)."""
    try:
        hints = get_type_hints(event)
    except Exception:  # a name the module cannot resolve: the class is checked no further here
        return
    for field in (f.name for f in dataclasses.fields(event) if f.name not in Event.ENVELOPE):
        kind = _unstorable(hints.get(field, Any), set())
        if kind is not None:
            yield field, kind


def _unstorable(hint: Any, seen: set[type]) -> str | None:
    while (supertype := getattr(hint, "__supertype__", None)) is not None:  # a NewType
        hint = supertype
    origin = get_origin(hint)
    if hint in (Any, object) or isinstance(hint, TypeVar) or origin is ClassVar:
        return None
    if origin is Literal:
        bad = [a for a in get_args(hint) if not isinstance(a, (str, int, bool, type(None), Enum))]
        return f"the literal {bad[0]!r}" if bad else None
    if origin is not None:
        if not (origin in (Union, UnionType) or origin in _CONTAINERS):
            return getattr(origin, "__name__", str(origin))
        for arg in get_args(hint):
            if arg is not Ellipsis and (kind := _unstorable(arg, seen)) is not None:
                return kind
        return None
    if not isinstance(hint, type):
        return None  # a string annotation or another form this check cannot read: left to the encoder
    if issubclass(hint, _STORABLE) and not issubclass(hint, BaseModel):
        return None
    if hint in _CONTAINERS:
        return None
    if dataclasses.is_dataclass(hint) or is_typeddict(hint):
        if hint in seen:
            return None
        seen.add(hint)
        try:
            nested = get_type_hints(hint)
        except Exception:
            return None
        return next((k for h in nested.values() if (k := _unstorable(h, seen)) is not None), None)
    return hint.__name__


def _string_like(key: Any) -> bool:
    if key is str or (get_origin(key) is Literal and all(isinstance(a, str) for a in get_args(key))):
        return True
    return getattr(key, "__supertype__", None) is str  # a NewType of str


def _personal(events: dict[type[Event], type[Aggregate]], aggregates: dict[type[Aggregate], str], say: Any) -> None:
    for event, aggregate in events.items():
        where = where_defined(event, aggregates[aggregate])
        try:
            fields = personal_fields(event)
        except Exception as e:
            say(where, f"event {event.__name__}'s annotations cannot be resolved ({type(e).__name__}: {e}), so its "
                "personal fields cannot be found")
            continue
        own = {f.name for f in dataclasses.fields(event)}
        for name, subject in fields:
            if subject in {n for n, _ in fields}:
                say(where, f"event {event.__name__}'s personal field {name} names {subject!r} as its data subject, "
                    "a personal field itself: the subject must be an identifier kept in plain text")
            elif subject not in own and not hasattr(aggregate, subject) and subject not in _field_names(aggregate):
                say(where, f"event {event.__name__}'s personal field {name} names the data subject {subject!r}, "
                    f"which is neither a field of {event.__name__} nor an attribute of {aggregate.__name__}")


def _field_names(cls: type) -> set[str]:
    return set(getattr(cls, "__dataclass_fields__", {}))


def _commands(domain: Domain, aggregates: dict[type[Aggregate], str], say: Any) -> None:
    seen: dict[type[Command], str] = {}
    by_type: dict[str, list[str]] = defaultdict(list)
    for d in domain.handlers:
        handler = d.value
        command = handler.command
        if not (isinstance(command, type) and issubclass(command, Command)):
            say(d.where, f"{command!r} is not a Command subclass")
            continue
        if command in seen:
            if seen[command] != d.where:
                say(d.where, f"command {command.__name__} has a second handler (the first at {seen[command]})")
            continue
        seen[command] = d.where
        type_field = command.model_fields.get("type")
        if type_field is None or not isinstance(type_field.default, str) or not get_args(type_field.annotation):
            say(d.where, f"command {command.__name__} has no fixed type: declare `type: Literal[\"...\"] = \"...\"` "
                "or leave it to the class name")
            continue
        by_type[command.type_name()].append(d.where)
        if handler.aggregate not in aggregates:
            name = getattr(handler.aggregate, "__name__", repr(handler.aggregate))
            say(d.where, f"the handler of {command.__name__} changes {name}, an aggregate the domain does not hold "
                "(register it with @domain.aggregate)")
        if (callable_problem := _handler_call(getattr(handler.run, "__wrapped__", handler.run))) is not None:
            say(d.where, f"the handler of {command.__name__} {callable_problem}: it is called with the aggregate and "
                "the command, and a third parameter (if it has one) gets the loader of other aggregates")
        if handler.target is derived_id and handler.stream is not Stream.NEW:
            say(d.where, f"the handler of {command.__name__} names no id, so each command would start a new stream: "
                "give id=\"<field>\" (the field holding the aggregate id), or Stream.NEW")
        field = getattr(handler.target, "__qualname__", "")
        if field.startswith("field "):
            name = field[len("field "):].strip("'")
            if name not in command.model_fields:
                say(d.where, f"the handler of {command.__name__} takes the aggregate id from field {name!r}, which "
                    f"{command.__name__} does not have")
    for name, places in by_type.items():
        for place in places[1:]:
            say(place, f"two commands have the type {name!r} (also {places[0]})")


def _handler_call(function: Any) -> str | None:
    """What keeps ``function`` from being called as a handler (two or three positional arguments); None if
    nothing does, or if its signature cannot be read."""
    if not callable(function):
        return f"is {function!r}, which cannot be called"
    if handler_arity(function) is not None:
        return None
    return f"takes {inspect.signature(function)}, which two or three positional arguments cannot call"


_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,99}")


def _errors(domain: Domain, say: Any) -> None:
    codes: dict[str, str] = {}
    for cls, where in _subclasses(domain.errors, DomainError, say):
        code = cls.code
        if code in CORE_CODES:
            say(where, f"error {cls.__name__} uses the code {code!r}, which commitline uses itself: give it its own")
        elif code in codes:
            say(where, f"error {cls.__name__} uses the code {code!r}, as another error does ({codes[code]})")
        codes.setdefault(code, where)
        if not isinstance(code, str) or _CODE.fullmatch(code) is None:
            say(where, f"error {cls.__name__}'s code {code!r} is not a usable code: letters, digits, '_', '-' and "
                "'.', starting with a letter, at most 100 (it is the end of the problem's type URI)")
        status = getattr(cls, "status", None)
        if not isinstance(status, int) or not 400 <= status <= 599:
            say(where, f"error {cls.__name__} needs an HTTP status from 400 to 599 (status = 409, 404, 422, ...), "
                f"not {status!r}")
        unknown = _unknown_placeholders(cls)
        if unknown:
            say(where, f"error {cls.__name__}'s message names {', '.join(unknown)}: not one of its fields "
                f"({', '.join(cls.fields) or 'none'}) nor an attribute of it, so raising it would fail")


def _read_models(domain: Domain, events: dict[type[Event], type[Aggregate]], say: Any) -> None:
    names: dict[str, str] = {}
    tables: dict[str, str] = {}
    for cls, where in _subclasses(domain.read_models, Projection, say):
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not NAME.fullmatch(name):
            say(where, f"read model {cls.__name__} needs a name of lowercase letters, digits or '_', not {name!r}")
            continue
        if name in names:
            say(where, f"two read models are named {name} (also {names[name]})")
        names.setdefault(name, where)
        if name in CORE_FOLLOWERS:
            say(where, f"read model {cls.__name__} is named {name!r}, a name another follower uses")
        declared = getattr(cls, "tables", ())
        if not declared:
            say(where, f"read model {name} declares no table (tables = (Table(...), ...))")
        for table in declared:
            if table.name in tables:
                say(where, f"read model {name} declares the table {table.name}, as {tables[table.name]} does")
            tables.setdefault(table.name, name)
            if (wrong := _table_name_problem(table.name)) is not None:
                say(where, f"read model {name}'s table {table.name!r} {wrong}")
                continue
            _table(name, table, where, say)
        own = {getattr(t, "name", None) for t in declared}
        for table in getattr(cls, "prefetch", {}):
            if table not in own:
                say(where, f"read model {name} prefetches rows of {table!r}, not one of its tables "
                    f"({', '.join(sorted(map(str, own)))})")
        for event in cls._handlers:
            if event not in events:
                say(where, f"read model {name} handles {getattr(event, '__name__', event)}, which no aggregate of "
                    "the domain emits")


def _table_name_problem(name: Any) -> str | None:
    """Why a read model's table cannot have this name; None when it can. A rebuild writes ``<name>__next`` and
    swaps it in, dropping ``<name>``: the name must leave room for the suffix within PostgreSQL's 63 bytes, and
    must never be one of the store's own tables."""
    if not isinstance(name, str) or not TABLE_NAME.fullmatch(name):
        return (f"must be lowercase letters, digits or '_', starting with a letter or '_', at most "
                f"{MAX_TABLE_NAME} characters (a rebuild adds {REBUILD_SUFFIX!r})")
    if name.endswith(REBUILD_SUFFIX):
        return f"ends with {REBUILD_SUFFIX!r}, the suffix of a rebuild's tables"
    if name in STORE_TABLES:
        return "is one of the store's own tables: a rebuild would drop it; choose another name (rm_...)"
    return None


def _table(read_model: str, table: Table, where: str, say: Any) -> None:
    """A table's key and counters are among its columns, and each column has a type."""
    columns = ", ".join(table.columns)
    if not table.key:
        say(where, f"read model {read_model}'s table {table.name} has no key: name its key columns (key=(...))")
    for column in table.key:
        if column not in table.columns:
            say(where, f"read model {read_model}'s table {table.name}: key column {column!r} is not one of its "
                f"columns ({columns})")
    for column in table.counters:
        if column not in table.columns:
            say(where, f"read model {read_model}'s table {table.name}: counter {column!r} is not one of its "
                f"columns ({columns})")
        elif column in table.key:
            say(where, f"read model {read_model}'s table {table.name}: {column!r} is a key column and a counter")
        elif isinstance(table.columns[column], str) and base_type(table.columns[column]) in NOT_NUMBERS:
            # (a type PostgreSQL does not know is told at start, by the database's check)
            say(where, f"read model {read_model}'s table {table.name}: counter {column!r} is of type "
                f"{table.columns[column]!r}, which cannot be added to (a number type: bigint, numeric, ...)")
    for column, sql_type in table.columns.items():
        if not isinstance(sql_type, str) or not sql_type.strip():
            say(where, f"read model {read_model}'s table {table.name}: column {column!r} needs an SQL type, "
                f"not {sql_type!r}")


def _process_managers(domain: Domain, events: dict[type[Event], type[Aggregate]], say: Any) -> None:
    names: dict[str, str] = {}
    read_models = {getattr(d.value, "name", None) for d in domain.read_models}
    for cls, where in _subclasses(domain.process_managers, ProcessManager, say):
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            say(where, f"process manager {cls.__name__} needs a name")
            continue
        if name in names:
            say(where, f"two process managers are named {name} (also {names[name]})")
        elif name in CORE_FOLLOWERS or name in read_models:
            say(where, f"process manager {cls.__name__} is named {name!r}, a name another follower uses")
        names.setdefault(name, where)
        if not cls.triggers:
            say(where, f"process manager {name} has no triggers (the event types it reacts to)")
        for event in cls.triggers:
            if event not in events:
                say(where, f"process manager {name} is triggered by {getattr(event, '__name__', event)}, which no "
                    "aggregate of the domain emits")
        for model in cls.read_models:
            if model not in read_models:
                say(where, f"process manager {name} names the read model {model!r}, which the domain does not hold")
        if cls.advance is ProcessManager.advance:
            say(where, f"process manager {name} does not implement advance(instance_id, tenant)")


def _ports_and_queries(domain: Domain, say: Any) -> None:
    ports: dict[str, str] = {}
    for d in domain.ports:
        name, factory = d.value
        if name in ports and ports[name] != d.where:
            say(d.where, f"the port {name!r} is declared twice (also {ports[name]})")
        if not callable(factory):
            say(d.where, f"the port {name!r}'s factory is not callable")
        ports.setdefault(name, d.where)
    paths: dict[str, str] = {}
    for d in domain.queries:
        path = d.value.path
        function = d.value.function.__name__
        if not isinstance(path, str) or not QUERY_PATH.fullmatch(path):
            say(d.where, f"query {function}'s path {path!r} must be segments separated by '/', each letters, digits, "
                "'_', '-', '.' or '~', or a {parameter} (no leading or trailing '/', no '?')")
            continue
        shape = re.sub(r"{\w+}", "{}", path)  # paths of one shape answer the same URLs: the first would win
        if shape in paths and paths[shape] != d.where:
            say(d.where, f"two queries are served at /v1/read-models/{path} (also {paths[shape]})")
        paths.setdefault(shape, d.where)
        signature = inspect.signature(d.value.function)
        parameters = list(signature.parameters)
        if parameters[:2] != ["reads", "tenant"]:
            say(d.where, f"query {function} must take (reads, tenant, ...) first, not ({', '.join(parameters[:2])})")
        placeholders = re.findall(r"{(\w+)}", path)
        for placeholder in dict.fromkeys(placeholders):
            if placeholders.count(placeholder) > 1:
                say(d.where, f"query {function}'s path names {{{placeholder}}} twice")
            if placeholder not in parameters:
                say(d.where, f"query {function} has no parameter {placeholder!r} for its path")
        try:
            hints = get_type_hints(d.value.function)
        except Exception:  # an annotation that does not resolve: FastAPI will say so when it serves the route
            hints = {}
        for name in parameters[2:]:
            if name not in hints:
                continue
            try:
                TypeAdapter(hints[name])
            except Exception as e:  # pydantic's refusal: the route could not be served
                say(d.where, f"query {function}'s parameter {name!r} has a type no request can give: "
                    f"{type(e).__name__}: {str(e).splitlines()[0]}")
    readers = _unique_declared(domain.readers)
    for d in readers:
        if not (isinstance(d.value, type) and issubclass(d.value, Reads)):
            say(d.where, f"{d.value!r} is not a Reads subclass")
    if len({d.value for d in readers}) > 1:
        say(readers[1].where, f"the domain has two query classes ({', '.join(d.value.__name__ for d in readers)}): "
            "one Reads subclass holds every query method")


def _unknown_placeholders(cls: type[DomainError]) -> list[str]:
    """The names the error's ``message`` template uses that the error will not have when it is raised."""
    template = cls.__dict__.get("message", getattr(cls, "message", ""))
    if not isinstance(template, str):  # a property computing the message: nothing to check statically
        return []
    try:
        names = {re.split(r"[.\[]", name, maxsplit=1)[0] for _, name, _, _ in string.Formatter().parse(template)
                 if name}
    except ValueError as e:
        return [f"a malformed template ({e})"]
    return sorted(n for n in names if n not in cls.fields and not hasattr(cls, n))


def _unique_declared(declared: Iterable[Declared[Any]]) -> list[Declared[Any]]:
    seen: set[int] = set()
    out = []
    for d in declared:
        if id(d.value) not in seen:
            seen.add(id(d.value))
            out.append(d)
    return out


def stored_problems(domain: Domain, pairs: Iterable[tuple[str, int]], schema: str) -> list[str]:
    """What the store (schema ``schema``) holds that ``domain`` cannot read: event types it does not declare,
    versions newer than their class, old versions without the upcasters that bring them to the current one."""
    found = []
    events = domain.registry.event_types
    for topic, version in sorted(pairs):
        cls = events.get(topic)
        where = f"schema {schema}"
        if cls is None:
            found.append(f"{where}: holds {topic} events (version {version}), a type the domain {domain.name!r} does "
                         "not declare: a store holds one domain's events (choose another COMMITLINE_SCHEMA, or "
                         "declare the type again: a renamed event class keeps its stored name with a type_name "
                         f"classmethod returning {topic!r})")
        elif version > cls.class_version:
            found.append(f"{where}: holds {cls.__name__} events at version {version}, newer than its class_version "
                         f"{cls.class_version} here (a newer release of the domain wrote them)")
        elif missing := cls.missing_upcasters(version):
            found.append(f"{where}: holds {cls.__name__} events at version {version}, and {cls.__name__} "
                         f"({where_defined(cls, '?')}) lacks {', '.join(missing)} to bring them to version "
                         f"{cls.class_version}")
    return found


def column_type_problems(domain: Domain, unknown: set[str]) -> list[str]:
    """The read models' columns whose types PostgreSQL does not know (``unknown``, as the database found them)."""
    found = []
    for d in _unique_declared(domain.read_models):
        cls = d.value
        for table in getattr(cls, "tables", ()):
            for column, sql_type in table.columns.items():
                if sql_type in unknown:
                    found.append(f"{where_defined(cls, d.where)}: read model {cls.name}'s table {table.name}: column "
                                 f"{column!r} has the type {sql_type!r}, which PostgreSQL does not know")
    return found
