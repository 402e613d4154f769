"""Which code a snapshot was taken with (``shape_of``), so that none is used by code that would fold the events
into another state.

A snapshot is an aggregate's state as the code of its day built it from the events. When that code changes (a
field added, removed or retyped, a change to ``_evolve``, to an event class or its upcaster, or to commitline's
``Aggregate``), the same events may fold into another state; a snapshot taken before would then give a command,
silently, a state the events do not give. So each snapshot is stored with the shape of the code that took it: a
digest of the aggregate's classes, commitline's ``Aggregate`` among them (their source and fields), and of its
event classes (``EVENTS``: their source and class version). A snapshot of another shape, or one the code cannot
decode, is not used: the stream is replayed from its first event, and snapshotted again (``event_store.py``).

Where a class's source cannot be read (a class made at run time), its qualified name stands in for it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect

from commitline.domain import Aggregate

#: Separates the aggregate's name from its shape in the snapshots table's ``aggregate_type`` column.
SEPARATOR = "/"


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return f"{cls.__module__}.{cls.__qualname__}"


def shape_of(cls: type[Aggregate]) -> str:
    """The shape of ``cls``'s snapshots: 16 hex digits, the same in every process running the same code."""
    digest = hashlib.sha256()
    for part in cls.__mro__:
        if part is not object and part.__module__ != "typing":
            digest.update(_source(part).encode())
    fields = [(f.name, str(f.type)) for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    digest.update(repr(fields).encode())
    for event in sorted(cls.EVENTS, key=lambda e: (e.__module__, e.__qualname__)):
        digest.update(f"\n{event.__qualname__} v{event.class_version}\n".encode())
        digest.update(_source(event).encode())
    return digest.hexdigest()[:16]


def stored_type(name: str, shape: str) -> str:
    """What the snapshots table's ``aggregate_type`` column holds: the aggregate's name and its snapshot's shape."""
    return f"{name}{SEPARATOR}{shape}"


def parsed_type(stored: str) -> tuple[str, str | None]:
    """(aggregate name, shape) of a stored ``aggregate_type``; the shape is None for a snapshot stored without one
    (before shapes), which is never used."""
    name, separator, shape = stored.partition(SEPARATOR)
    return name, shape if separator else None
