"""What ``dispatch`` returns: the changed stream, its new version and the events recorded.

The same JSON form is stored as the idempotency outcome, so a replayed result equals
the original in every field except ``replayed``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict


class RecordedEventView(BaseModel):
    model_config = ConfigDict(frozen=True)

    event_id: UUID
    type: str
    aggregate_type: str
    aggregate_id: UUID
    version: int
    occurred_at: datetime
    tenant: str
    payload: dict[str, Any]


class DispatchResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    command_type: str
    tenant: str
    aggregate_type: str
    aggregate_id: UUID
    version: int
    events: tuple[RecordedEventView, ...]
    replayed: bool = False

    def outcome_bytes(self) -> bytes:
        return self.model_dump_json(exclude={"replayed"}).encode()

    @classmethod
    def from_outcome(cls, outcome: bytes) -> DispatchResult:
        return cls.model_validate_json(outcome).model_copy(update={"replayed": True})
