"""The JSON shapes of the read endpoints, for /openapi.json (``reads.py`` renders the same values with
orjson, as the CLI prints them; the HTTP tests validate every answer against these models).

Aggregate answers are the CLI's ``commitline audit ... --json`` documents; times are ISO 8601 with an
offset, ids UUID strings, amounts decimal strings (never binary floats).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AggregateOut(Shape):
    """The aggregate now: its state replayed from every event (never from a snapshot)."""

    aggregate_id: UUID
    aggregate_type: str = Field(description="the aggregate's class name in its domain")
    tenant: str
    version: int = Field(description="the last version; send it as expected_version with the next command")
    recorded_at: datetime = Field(description="when the last event was recorded")
    state: dict[str, Any] = Field(description="the aggregate's fields, sets as sorted lists")


class StateOut(Shape):
    """The aggregate's state at a version, or at the last version recorded at or before a time."""

    aggregate_id: UUID
    aggregate_type: str
    version: int
    recorded_at: datetime
    state: dict[str, Any]


class HistoryEntryOut(Shape):
    version: int
    recorded_at: datetime
    type: str = Field(description="the event type, as the domain names it")
    event_id: UUID
    payload: dict[str, Any]
    transition: str | None = Field(description="e.g. 'state: CREATED -> PENDING'; null when no state machine moved")
    state_after: dict[str, Any]


class HistoryOut(Shape):
    aggregate_id: UUID
    aggregate_type: str
    tenant: str
    entries: list[HistoryEntryOut]


class ChangeOut(Shape):
    from_: Any = Field(alias="from")
    to: Any


class DiffOut(Shape):
    aggregate_id: UUID
    aggregate_type: str
    from_version: int
    to_version: int
    changed: dict[str, ChangeOut] = Field(description="each field that differs: its value at from and at to")
    events: list[HistoryEntryOut] = Field(description="the events after from_version up to to_version")


class BrokenStreamOut(Shape):
    aggregate_id: UUID
    tenant: str | None = Field(description="the stream's owner (null when nothing stored names it)")
    problem: str = Field(description="content, link or truncated")
    version: int | None = Field(description="the first event that does not verify")
    detail: str


class VerifyOut(Shape):
    ok: bool
    streams: int
    events: int
    seconds: float
    broken: list[BrokenStreamOut]
