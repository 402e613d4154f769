"""Per-stream access to the event tables: a stream's events read with its latest snapshot and head hash, the
read before a command (the key's record and the stream, one round trip), one event's stored hash, a stream's
version, snapshots saved, idempotency records found and the events they refer to. ``StreamReads`` is a part of
``EventRecorder`` (``recorder.py``), with the recorder's statements and connections.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from commitline.application.chain import GENESIS
from commitline.application.ports import IdempotencyRecord
from commitline.infrastructure.store import pipelined
from commitline.infrastructure.store.pipelined import SYNC
from commitline.infrastructure.store.statements import Statements


@dataclass(frozen=True)
class Snapshot:
    aggregate_id: UUID
    version: int
    aggregate_type: str
    state: bytes
    event_hash: bytes  # the chain hash of the event at ``version``
    # Read with the snapshot (never stored in it): the stored state of the stream's first event, which
    # names the tenant that owns the stream, so a snapshot-based load knows the owner in the same round trip.
    first_event_state: bytes | None = None


class ReadEvent(NamedTuple):
    """One event as the command's read returns it (its stream's id is the read's)."""

    version: int
    topic: str
    state: bytes


class ReadArgs(NamedTuple):
    """What one read before a command asks for (``read_for_command``'s arguments)."""

    aggregate_id: UUID
    known_version: int
    use_snapshot: bool
    tenant: str
    key: str


@dataclass
class CommandRead:
    """What ``read_for_command`` found: the key's record, the snapshot, the events after it or after the
    version the caller knew, and the hash of the last of them (None if it read neither)."""

    idempotency: IdempotencyRecord | None = None
    snapshot: Snapshot | None = None
    events: list[ReadEvent] = field(default_factory=list)
    head_hash: bytes | None = None


#: Stored type names as read (bytes) and decoded: a stream's events repeat a few of them.
_topics: dict[bytes, str] = {}


def _topic(raw: bytes) -> str:
    topic = raw.decode()
    if len(_topics) < 10_000:  # a domain has far fewer event types: whatever else is stored is not kept
        _topics[raw] = topic
    return topic


class StreamReads:
    """The per-stream part of ``EventRecorder``."""

    _q: Statements
    _connection: Callable[[], Any]

    def load_stream(self, aggregate_id: UUID, after_snapshot: bool) -> tuple[Snapshot | None, list[StoredEvent], bytes]:
        """The latest snapshot (if wanted, with the state of the stream's first event, which names its
        tenant), the events after it, and the stream's head hash: one statement, so the snapshot and the
        events come from the same database snapshot."""
        query = self._q.stream_after_snapshot if after_snapshot else self._q.stream_from_start
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(query, {"id": aggregate_id}, prepare=True).fetchall()
        snapshot = None
        if rows and rows[0][0]:
            _, version, aggregate_type, state, event_hash, first = rows.pop(0)
            snapshot = Snapshot(aggregate_id, version, aggregate_type, bytes(state), bytes(event_hash),
                                bytes(first) if first is not None else None)
        events = [StoredEvent(aggregate_id, v, t, bytes(s)) for _, v, t, s, _, _ in rows]
        head_hash = bytes(rows[-1][4]) if rows else snapshot.event_hash if snapshot else GENESIS
        return snapshot, events, head_hash

    def read_for_command(self, aggregate_id: UUID, known_version: int, use_snapshot: bool, tenant: str,
                         key: str) -> CommandRead:
        """One round trip before a command: the key's record, and the stream after ``known_version``
        (from its latest snapshot above that version if ``use_snapshot``): one statement, one snapshot."""
        return self.read_many([ReadArgs(aggregate_id, known_version, use_snapshot, tenant, key)])[0]

    def read_many(self, reads: Sequence[ReadArgs]) -> list[CommandRead]:
        """Several commands' reads (as ``read_for_command``) in one round trip, each its own statement and
        implicit transaction (a sync after each): per read what it found. A statement the server fails (it is
        shutting down, in recovery...) fails them all, raised as any failed read is (``StoreUnavailable``)."""
        steps: list[pipelined.Step] = []
        for r in reads:
            steps += [(self._q.read_for_command, (r.aggregate_id, r.known_version, r.tenant, r.key, r.use_snapshot)),
                      SYNC]
        with self._connection() as conn:
            results = pipelined.run(conn, steps)
            if pipelined.statements_lost(conn, results):
                results = pipelined.run(conn, steps)
            for result in results[::2]:
                if not pipelined.ok(result):
                    raise pipelined.error_of(result, conn.pgconn)  # type: ignore[arg-type]
        return [_command_read(result, r) for r, result in zip(reads, results[::2], strict=True)]

    def event_hash(self, aggregate_id: UUID, version: int) -> bytes:
        """The stored hash of one event; GENESIS for version 0 and for an event that does not exist
        (then the insert of the next version conflicts anyway)."""
        if version <= 0:
            return GENESIS
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(
                self._q.select_hash, (aggregate_id, version), prepare=True).fetchone()
        return bytes(row[0]) if row else GENESIS

    def stream_version(self, aggregate_id: UUID) -> int:
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(self._q.stream_head, (aggregate_id,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def save_snapshots(self, snapshots: Sequence[Snapshot]) -> None:
        """Insert ``snapshots`` in one statement and one transaction, which does not wait for its WAL to reach the
        disk: a snapshot is derived from committed events, so one lost in a crash only costs a longer replay.
        Only a snapshot whose event the log holds, with its hash, is written, and the same statement deletes the
        older snapshots of its stream: a stream keeps its latest one (of several in ``snapshots`` for one
        stream, only the latest is written)."""
        latest: dict[UUID, Snapshot] = {}
        for s in snapshots:
            known = latest.get(s.aggregate_id)
            if known is None or s.version > known.version:
                latest[s.aggregate_id] = s
        columns: tuple[list[Any], ...] = ([], [], [], [], [])
        for s in latest.values():
            for column, value in zip(columns, (s.aggregate_id, s.version, s.aggregate_type, s.state, s.event_hash)):
                column.append(value)
        steps: list[pipelined.Step] = [b"BEGIN", b"SET LOCAL synchronous_commit = off",
                                       (self._q.insert_snapshots, columns), b"COMMIT", SYNC]
        with self._connection() as conn:
            results = pipelined.run(conn, steps)
            if not pipelined.committed(results[3]) and pipelined.statements_lost(conn, results):
                if conn.pgconn.transaction_status != TransactionStatus.IDLE:
                    conn.rollback()
                results = pipelined.run(conn, steps)  # nothing ran: the prepared insert was gone
            if not pipelined.committed(results[3]):
                failed = next((r for r in results if r is not None and r.status == pipelined.FATAL), None)
                if conn.pgconn.transaction_status != TransactionStatus.IDLE:
                    conn.rollback()
                if failed is not None:
                    raise pipelined.error_of(failed, conn.pgconn)
                raise pg_errors.InFailedSqlTransaction("the snapshots' transaction failed before COMMIT")

    def find_idempotency(self, tenant: str, key: str) -> tuple[IdempotencyRecord, list[tuple[int, str, bytes]]] | None:
        """The key's record, and the stored events it refers to (as ``command_events`` reads them), in one
        statement."""
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._q.select_idempotency, (tenant, key), prepare=True).fetchall()
        if not rows:
            return None
        row = rows[0]
        record = IdempotencyRecord(tenant, key, bytes(row[0]), row[1], row[2], row[3],
                                   bytes(row[4]) if row[4] is not None else None, row[5], row[6])
        return record, [(v, t, bytes(s)) for *_, v, t, s in rows if v is not None]

    def command_events(self, aggregate_id: UUID, after: int, upto: int) -> list[tuple[int, str, bytes]]:
        """The stored events of one stream from version ``after + 1`` to ``upto`` (a command's, which its key's
        record refers to): (version, topic, state) each."""
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._q.command_events, (aggregate_id, after, upto), prepare=True).fetchall()
        return [(v, t, bytes(s)) for v, t, s in rows]


def _command_read(result: Any, r: ReadArgs) -> CommandRead:
    """What one ``read_for_command`` statement returned."""
    aggregate_id, tenant, key = r.aggregate_id, r.tenant, r.key
    value = result.get_value
    read = CommandRead()
    events = read.events
    rows = result.ntuples
    for row in range(rows):
        kind = int.from_bytes(value(row, 0), "big")
        if kind == 0:  # the most rows by far: only what a replay needs (the head's hash is read below)
            raw = value(row, 2)
            topic = _topics.get(raw) or _topic(raw)
            events.append(ReadEvent(int.from_bytes(value(row, 1), "big", signed=True), topic, value(row, 3)))
        elif kind == 1:
            first = value(row, 5)
            read.snapshot = Snapshot(aggregate_id, pipelined.int8(value(row, 1)), pipelined.text(value(row, 2)),
                                     bytes(value(row, 3)), bytes(value(row, 4)),
                                     bytes(first) if first is not None else None)
            read.head_hash = read.snapshot.event_hash
        else:  # the outcome (state) of a record from before migration 14, else its event count and type
            outcome, count, kind_of = value(row, 3), value(row, 7), value(row, 5)
            read.idempotency = IdempotencyRecord(
                tenant, key, bytes(value(row, 4)), pipelined.text(value(row, 2)),
                pipelined.uuid(value(row, 6)), pipelined.int8(value(row, 1)),
                bytes(outcome) if outcome is not None else None,
                pipelined.int8(count) if count is not None else None,
                pipelined.text(kind_of) if kind_of is not None else None)
    if events:
        read.head_hash = bytes(value(rows - 1, 4))
    return read
