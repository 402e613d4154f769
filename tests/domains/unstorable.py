"""A domain whose events declare fields their JSON cannot store and read back: bytes, a complex number, a
timedelta, an arbitrary class, a pydantic model, and bytes inside a dataclass in a list; beside fields that are
storable (an optional dataclass of Decimals, a str-keyed dict of ``Any``, a Literal, an int Enum, a TypedDict).
Used by tests/unit/test_domain_checks.py: each unstorable one is refused at load, naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from enum import IntEnum
from typing import Any, Literal, TypedDict

from pydantic import BaseModel

from commitline import Aggregate, Domain, Event

domain = Domain("unstorable")


class Blob:
    pass


class Note(BaseModel):
    text: str


@dataclass(frozen=True)
class Attachment:
    name: str
    content: bytes


@dataclass(frozen=True)
class Leg:
    amount: Decimal
    fee: Decimal | None = None


class Grade(IntEnum):
    LOW = 1


class Meta(TypedDict):
    source: str
    at: int


class Filed(Event):
    digest: bytes
    phase: complex
    wait: timedelta
    blob: Blob | None
    note: Note
    attachments: list[Attachment]
    leg: Leg | None
    extra: dict[str, Any]
    kind: Literal["a", "b"]
    grade: Grade
    meta: Meta


@domain.aggregate
class Folder(Aggregate):
    EVENTS = (Filed,)

    def _evolve(self, event: Event) -> None:
        pass
