"""Which code a snapshot was taken with (``shape_of``), so that none is used by code that would fold the events
into another state.

A snapshot is an aggregate's state as the code of its day built it from the events. When that code changes (a
field added, removed or retyped, a change to ``_evolve``, to an event class or its upcaster, or to commitline's
``Aggregate``), the same events may fold into another state; a snapshot taken before would then give a command,
silently, a state the events do not give. So each snapshot is stored with the shape of the code that took it: a
digest of the source files of the modules defining the aggregate's classes (commitline's ``Aggregate`` among
them) and its event classes (``EVENTS``), and of the modules of the same package those modules take functions,
classes or whole modules from, and so on (``_used_modules``: the helper an ``_evolve`` calls may live in another
file), of the aggregate's fields and of the events' class versions. A snapshot
of another shape, or one the code cannot decode, is not used: the stream is replayed from its first event, and
snapshotted again (``event_store.py``).

Whole files, not the classes' own lines: reading and hashing a file costs microseconds where finding a class in
it (``inspect.getsource``) costs tens of milliseconds, so the store works every shape out as it starts, while the
files on disk are those its code was imported from (a deploy that replaces them under a running process cannot
give that process the new code's shape). Any change to such a file makes its snapshots unused once, which only
costs each stream one replay. A module without a file (made at run time) is named instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path
from types import ModuleType

from commitline.domain import Aggregate

#: Separates the aggregate's name from its shape in the snapshots table's ``aggregate_type`` column.
SEPARATOR = "/"


def _module_source(name: str) -> bytes:
    path = getattr(sys.modules.get(name), "__file__", None)
    try:
        return Path(path).read_bytes() if path else name.encode()
    except OSError:
        return name.encode()


def _follows(name: str, root: str) -> bool:
    """Whether a module named ``name``, used by one of package ``root``, is part of the code a shape covers: one
    of the same package (for commitline's own modules, only its domain building blocks and its examples)."""
    if root == "commitline":
        return name.startswith(("commitline.domain", "commitline.examples"))
    return name.partition(".")[0] == root


def _used_modules(seed: set[str]) -> set[str]:
    """``seed`` and, transitively, the modules of their own package whose functions, classes or selves they hold
    as globals (``from .policy import net_of``, ``from . import policy``). A constant imported by name
    (``from .policy import FEE_RATE``) carries no module: it is not followed."""
    found, todo = set(seed), list(seed)
    while todo:
        module = sys.modules.get(todo.pop())
        if module is None:
            continue
        root = module.__name__.partition(".")[0]
        for value in list(vars(module).values()):
            if isinstance(value, ModuleType):
                name = value.__name__
            elif isinstance(value, type) or callable(value):
                name = getattr(value, "__module__", None)
            else:
                continue
            if isinstance(name, str) and name not in found and name in sys.modules and _follows(name, root):
                found.add(name)
                todo.append(name)
    return found


def shape_of(cls: type[Aggregate]) -> str:
    """The shape of ``cls``'s snapshots: 16 hex digits, the same in every process running the same code."""
    classes = [c for c in cls.__mro__ if c.__module__ not in ("builtins", "typing")]
    events = sorted(cls.EVENTS, key=lambda e: (e.__module__, e.__qualname__))
    digest = hashlib.sha256()
    for module in sorted(_used_modules({c.__module__ for c in [*classes, *events]})):
        digest.update(f"\n{module}\n".encode())
        digest.update(_module_source(module))
    fields = [(f.name, str(f.type)) for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    digest.update(repr([c.__qualname__ for c in classes]).encode())
    digest.update(repr(fields).encode())
    digest.update(repr([(e.__qualname__, e.class_version) for e in events]).encode())
    return digest.hexdigest()[:16]


def stored_type(name: str, shape: str) -> str:
    """What the snapshots table's ``aggregate_type`` column holds: the aggregate's name and its snapshot's shape."""
    return f"{name}{SEPARATOR}{shape}"


def parsed_type(stored: str) -> tuple[str, str | None]:
    """(aggregate name, shape) of a stored ``aggregate_type``; the shape is None for a snapshot stored without one
    (before shapes), which is never used."""
    name, separator, shape = stored.partition(SEPARATOR)
    return name, shape if separator else None
