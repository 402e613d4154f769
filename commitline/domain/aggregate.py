"""The aggregate and event base classes: immutable events, state rebuilt by applying them.

An aggregate never performs I/O. Command methods check the rules, then ``_emit`` an
event (``_move`` does both for a state change: ``_transition`` checks it against the
aggregate's ``TRANSITIONS``, then the event is emitted). ``apply`` is the only place state
changes (each aggregate's ``_evolve`` is one ``match`` over its events), so replaying
stored events through ``apply`` rebuilds exactly the state the commands produced.

Subclasses of both are dataclasses without a decorator: an event is frozen and keyword-only, an
aggregate keyword-only and mutable (its fields are the whole state).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any, ClassVar, Self, dataclass_transform
from uuid import UUID

from commitline.domain.decimals import number_fields, refuse_inexact
from commitline.domain.errors import IllegalTransition
from commitline.domain.frozen import frozen, may_hold_containers
from commitline.domain.fsm import TransitionTable
from commitline.domain.ids import new_id


@dataclass_transform(kw_only_default=True, frozen_default=True)
@dataclass(frozen=True, kw_only=True)
class Event:
    """Something that happened to one aggregate. Subclasses add the payload fields and are
    made frozen, keyword-only dataclasses by this base (no decorator needed).

    ``class_version`` and ``upcast_vN_vM`` static methods on a subclass evolve old
    stored payloads to the current shape; history is never rewritten. An upcaster takes the
    stored payload as JSON values (a dict) and returns it in the next version's shape.
    """

    event_id: UUID
    aggregate_id: UUID
    version: int
    occurred_at: datetime

    class_version: ClassVar[int] = 1
    ENVELOPE: ClassVar[frozenset[str]] = frozenset({"event_id", "aggregate_id", "version", "occurred_at"})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if may_hold_containers(cls, cls.ENVELOPE):
            # Each list and dict of the payload replaced by a read-only copy (``frozen.py`` says why) as the event
            # is made: emitted by a command, decoded from the store or written by a test; before a ``__post_init__``
            # of the class's own runs. Only where a field may hold one: the others pay nothing for it.
            own = getattr(cls, "__post_init__", None)  # the class's own or one it inherits

            def __post_init__(self: Event, *args: Any) -> None:
                fields = self.__dict__
                for name in _payload_fields(type(self)):
                    value = fields.get(name)
                    if type(value) in _THAWED:
                        fields[name] = frozen(value)
                if own is not None:
                    own(self, *args)

            cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
        dataclass(frozen=True, kw_only=True)(cls)

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__

    @classmethod
    def payload_fields(cls) -> tuple[str, ...]:
        """The names of the payload's fields (every field but the envelope's)."""
        return _payload_fields(cls)

    def payload(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _payload_fields(type(self))}

    @classmethod
    def upcast(cls, data: dict[str, Any], version: int) -> dict[str, Any]:
        """A payload stored at ``version`` in the current version's shape, through each upcaster in turn."""
        while version < cls.class_version:
            data = getattr(cls, f"upcast_v{version}_v{version + 1}")(data)
            version += 1
        return data

    @classmethod
    def upcasters(cls) -> list[int]:
        """The versions N this class has an ``upcast_vN_vN+1`` for, in order."""
        found = []
        for name in dir(cls):
            if name.startswith("upcast_v") and callable(getattr(cls, name)):
                start, _, end = name[len("upcast_v"):].partition("_v")
                if start.isdigit() and end.isdigit() and int(end) == int(start) + 1:
                    found.append(int(start))
        return sorted(found)

    @classmethod
    def missing_upcasters(cls, since: int | None = None) -> list[str]:
        """The upcasters a payload stored at version ``since`` lacks on its way to ``class_version``; with no
        ``since``, the holes in the declared chain (from its first upcaster to ``class_version``)."""
        declared = cls.upcasters()
        if since is None:
            if not declared:
                return []
            since = declared[0]
        return [f"upcast_v{v}_v{v + 1}" for v in range(since, cls.class_version) if v not in declared]


_THAWED = (list, dict)


@functools.cache
def _payload_fields(cls: type[Event]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.ENVELOPE)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass_transform(kw_only_default=True)
@dataclass(kw_only=True)
class Aggregate:
    """Base of every aggregate. Fields declared by subclasses are the whole state; each subclass is
    made a keyword-only dataclass by this base (no decorator needed).

    ``EVENTS`` are the event classes it applies. ``TRANSITIONS`` is its transition table and
    ``MACHINE`` the field holding the machine's state (default ``"state"``), or a pair (name shown in
    ``fsm_states()`` and history, field). A field holding a dict holds one machine per entry (each
    entry has a ``state``), named "<name> <key>".
    """

    id: UUID
    version: int = 0

    EVENTS: ClassVar[tuple[type[Event], ...]] = ()
    TRANSITIONS: ClassVar[TransitionTable[Any] | None] = None
    MACHINE: ClassVar[str | tuple[str, str] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(kw_only=True)(cls)
        # A ``field(default_factory=...)`` is removed from the class by ``dataclass``; put it back so that an
        # explicit ``@dataclass`` applied after this one still sees it (instead of a field without default).
        for f in dataclasses.fields(cls):
            if f.default_factory is not dataclasses.MISSING and f.name in cls.__dict__.get("__annotations__", {}):
                setattr(cls, f.name, f)

    @classmethod
    def machine(cls) -> tuple[str, str] | None:
        """(machine name, state field), or None for an aggregate without a transition table."""
        if cls.TRANSITIONS is None:
            return None
        if cls.MACHINE is None:
            return ("state", "state")
        if isinstance(cls.MACHINE, str):
            return (cls.MACHINE, cls.MACHINE)
        return cls.MACHINE

    @classmethod
    def blank(cls, aggregate_id: UUID) -> Self:
        """The aggregate before its first event: every field at its default."""
        return cls(id=aggregate_id)

    @classmethod
    def replay(cls, aggregate_id: UUID, events: list[Event], start: Self | None = None) -> Self:
        aggregate = start if start is not None else cls.blank(aggregate_id)
        for event in events:
            aggregate.apply(event)
        return aggregate

    @property
    def exists(self) -> bool:
        return self.version > 0

    def fsm_states(self) -> dict[str, str]:
        """The current state of each finite-state machine in this aggregate, by machine name."""
        machine = self.machine()
        if machine is None:
            return {}
        name, field = machine
        state = getattr(self, field)
        if isinstance(state, Mapping):
            return {f"{name} {key}": entry.state.value for key, entry in state.items()}
        return {name: state.value} if state is not None else {}

    def _transition(self, target: Enum, key: str | None = None) -> None:
        """Raise IllegalTransition unless ``TRANSITIONS`` lets the machine move to ``target`` now
        (from NEW, before its first state, it cannot). ``key`` picks the entry of a per-entry machine."""
        machine = self.machine()
        assert self.TRANSITIONS is not None and machine is not None, f"{type(self).__name__} has no machine"
        current = getattr(self, machine[1])
        self.TRANSITIONS.check(current if key is None else current[key].state, target, type(self).__name__)

    def _move(self, target: Enum, event_type: type[Event], /, **payload: Any) -> None:
        """Check the move to ``target`` (``_transition``), then emit the event that makes it; an event whose
        ``_evolve`` puts the machine anywhere else is a defect of the domain (RuntimeError: nothing is written)."""
        self._transition(target)
        self._record(self._new(event_type, payload))  # checked already: _emit's check would repeat it
        reached = getattr(self, self.machine()[1])  # type: ignore[index]  # _transition asserted a machine
        if reached is not target and reached != target:
            shown = reached.value if isinstance(reached, Enum) else reached
            raise RuntimeError(f"{type(self).__name__}._move to {target.value}: its {event_type.__name__} left the "
                               f"machine at {shown} (its _evolve must set the state _move names)")

    def apply(self, event: Event) -> None:
        if event.version != self.version + 1:
            raise ValueError(
                f"{type(self).__name__} {self.id}: event version {event.version} does not follow {self.version}"
            )
        if type(event) not in self.EVENTS:
            raise TypeError(self._not_listed(type(event)))
        self._evolve(event)
        self.version = event.version

    def _not_listed(self, event_type: type[Event]) -> str:
        name, event = type(self).__name__, event_type.__name__
        twin = next((e for e in self.EVENTS if e.__qualname__ == event_type.__qualname__), None)
        if twin is not None:  # the same class under another module: one file imported twice
            return (f"{type(self).__module__}.{name} cannot apply {event_type.__module__}.{event}: its EVENTS hold "
                    f"{twin.__module__}.{event}, another class of the same name (one file imported as two modules? "
                    f"use the classes of the module the domain was loaded from)")
        return (f"{name} cannot apply {event}: it is not one of {name}.EVENTS (every event the aggregate emits is "
                "listed there)")

    def _evolve(self, event: Event) -> None:
        """Change the state as ``event`` says: one ``match`` over ``EVENTS``, no rules, no I/O."""
        raise NotImplementedError

    def _emit(self, event_type: type[Event], **payload: Any) -> None:
        """Apply a new event and keep it to be stored. Whatever state change it makes is checked against
        ``TRANSITIONS`` (IllegalTransition, and the command writes nothing), however the handler made it:
        ``_move``, or ``_emit`` of an event whose ``_evolve`` moves the machine."""
        event = self._new(event_type, payload)
        machine = self.machine()
        if machine is None:
            return self._record(event)
        before = getattr(self, machine[1])
        if before is None or isinstance(before, Enum):  # one machine: the common case, kept cheap
            fields = dict(self.__dict__)
            self.apply(event)
            after = getattr(self, machine[1])
            if before is not None and after is not before:
                try:
                    self._check_move(before, after)
                except IllegalTransition:  # refused: the aggregate as it was, as for a refusal before any event
                    self._restore(fields, None)
                    raise
            self._pending().append(event)
            return None
        if not isinstance(before, Mapping):  # neither kind of machine: the domain check refuses such a table
            return self._record(event)
        entries = {key: (entry, entry.state) for key, entry in before.items()}
        fields = dict(self.__dict__)
        self.apply(event)
        try:
            self._check_moves(entries)
        except IllegalTransition:
            self._restore(fields, entries)
            raise
        self._pending().append(event)
        return None

    def _new(self, event_type: type[Event], payload: dict[str, Any]) -> Event:
        if numbers := number_fields(event_type, event_type.ENVELOPE):
            refuse_inexact(event_type, payload, numbers)
        return event_type(event_id=new_id(), aggregate_id=self.id, version=self.version + 1, occurred_at=utcnow(),
                          **payload)

    def _record(self, event: Event) -> None:
        self.apply(event)
        self._pending().append(event)

    def _check_moves(self, before: Mapping[Any, tuple[Any, Enum]]) -> None:
        """Raise IllegalTransition for an entry's state change since ``before`` (a per-entry machine's entries
        and their states) that ``TRANSITIONS`` does not allow. An entry's first state is free, as it is for
        ``_move``'s creation events; one that stays where it was has made no move. (One machine's change is
        checked inline by ``_emit``.)"""
        after = getattr(self, self.machine()[1])  # type: ignore[index]
        if isinstance(after, Mapping):
            for key, entry in after.items():
                old = before[key][1] if key in before else None
                if old is not None and entry.state != old:
                    self._check_move(old, entry.state)

    def _check_move(self, before: Enum, after: Enum | None) -> None:
        table, name = self.TRANSITIONS, type(self).__name__
        assert table is not None
        if after is None:  # back to no state at all: no row of a table leads there
            raise IllegalTransition(table.aggregate or name, before.value, "NEW",
                                    (s.value for s in table.allowed.get(before, ())))
        if after != before:
            table.check(before, after, name)

    def _restore(self, fields: dict[str, Any], before: Any) -> None:
        """Undo a refused event's ``_evolve``: the fields it reassigned, and a per-entry machine's entries and
        their states, which it may have changed in place."""
        self.__dict__.clear()
        self.__dict__.update(fields)
        entries = getattr(self, self.machine()[1])  # type: ignore[index]
        if isinstance(entries, dict) and isinstance(before, Mapping):
            entries.clear()
            for key, (entry, state) in before.items():
                if entry.state != state:
                    object.__setattr__(entry, "state", state)  # an entry may be a frozen dataclass
                entries[key] = entry

    def _pending(self) -> list[Event]:
        # Kept outside the dataclass fields so snapshots and equality see state only.
        return self.__dict__.setdefault("_pending_events", [])

    def collect_events(self) -> list[Event]:
        pending = self._pending()
        events = list(pending)
        pending.clear()
        return events
