"""What the application needs from storage, stated as a protocol the infrastructure fulfils."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from uuid import UUID

from commitline.application.results import DispatchResult
from commitline.domain import Aggregate, Event

A = TypeVar("A", bound=Aggregate)


class StreamMoved(Exception):
    """Raised by ``append`` when another writer already took a version being appended."""


class PredecessorMissing(StreamMoved):
    """Raised by ``append`` when the stream's stored history is not the one the events continue: the version
    before the first of them is not stored with the hash they chain from (or, for version 1, the stream already
    has events). A copy decided on a history that is no longer there (e.g. one a failover lost) is refused like
    one another writer moved: the command reads the stream and decides again."""


class KeyAlreadyRecorded(Exception):
    """Raised by ``append`` when the idempotency key was committed by a concurrent twin."""


class ForeignStream(Exception):
    """Raised by ``load(..., tenant=...)`` when the stream belongs to another tenant. Raised before
    anything of the stream is decoded or type-checked, so a caller learns nothing else about it;
    the processor turns it into the same refusal as for a stream that does not exist."""


class IdempotencyRecordBroken(Exception):
    """A key's record cannot give its answer: the events it refers to (its command's, read back on a replay) are
    not stored as it says (missing, of another tenant, unreadable), or it refers to none and holds no outcome
    either. Nothing is answered in its place and nothing is written. A fault of the store, not of the request (not
    a ``CommitlineError``: the HTTP API answers 500 ``internal_error``); ``commitline audit verify`` checks the
    events."""

    def __init__(self, tenant: str, key: str, reason: str):
        self.tenant, self.key, self.reason = tenant, key, reason
        super().__init__(f"the idempotency record of key {key!r} (tenant {tenant!r}) cannot be replayed: {reason}")


@dataclass(frozen=True)
class IdempotencyRecord:
    """What a key stands for: the request's fingerprint and what its answer is made of.

    A record refers to the events its command appended, which are immutable: ``event_count`` of them, the last at
    ``stream_version`` of ``aggregate_id`` (``aggregate_type`` is given only for a command with no events). A record
    stored before that (migration 14) holds its ``outcome`` instead, the answer's JSON. The store gives a record it
    finds its ``answer``: a call that reads the events back and returns the answer as first given, ``replayed``
    (only called for the same request: a reused key's events are not read)."""

    tenant: str
    key: str
    fingerprint: bytes
    command_type: str
    aggregate_id: UUID
    stream_version: int
    outcome: bytes | None = None
    event_count: int | None = None
    aggregate_type: str | None = None
    answer: Callable[[], DispatchResult] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class CommandLoad:
    """What a command starts from, read in one round trip: the key's stored record if the key was used
    (then nothing else was decoded: ``aggregate`` is None), else the aggregate to decide on; ``foreign``
    when its stream is another tenant's (then ``aggregate`` is a blank stand-in, nothing of it decoded).

    ``verified`` is False for a cached copy handed out without any read (``trust_cache``): the key was not
    looked up and the copy may be stale. Deciding on it is safe because the append checks both (the key's
    record and the stream's next version are unique, and the version before must be stored with the hash the
    copy continues from), but a refusal, a lost race or a failed append is then
    no answer yet: the caller loads again with a read and decides again."""

    aggregate: Aggregate | None
    foreign: bool
    earlier: IdempotencyRecord | None
    verified: bool = True


class EventStore(Protocol):
    def load(self, cls: type[A], aggregate_id: UUID, *, tenant: str | None = None) -> A:
        """The aggregate as of its latest event; a blank one (version 0) if it has none.

        A stream belongs to the tenant of its first event. With ``tenant``, a stream owned by another
        tenant raises ForeignStream; without it the load is not tenant-scoped (operators, tests)."""

    def load_for_command(self, cls: type[A], aggregate_id: UUID, *, tenant: str, key: str,
                         trust_cache: bool = False) -> CommandLoad:
        """The (tenant, key) record, or the aggregate the command changes (tenant-scoped as above):
        for the processor, which then decides and ``append``s it (or drops it). With ``trust_cache`` the
        store may return its cached copy of the stream without reading anything (``verified=False``)."""

    def distrust(self, aggregate_id: UUID) -> None:
        """Another writer moved this stream under a cached copy: verify every later load of it with a read."""

    def append(
        self, aggregate: Aggregate, events: Sequence[Event], *, tenant: str, idempotency: IdempotencyRecord | None
    ) -> None:
        """Atomically store the events and the idempotency record, or raise StreamMoved (PredecessorMissing when
        the stored stream is not the history the events continue)/KeyAlreadyRecorded (or EventTooLarge, before
        writing anything)."""

    def find_outcome(self, tenant: str, key: str) -> IdempotencyRecord | None: ...

    def stream_version(self, aggregate_id: UUID) -> int: ...
