"""Per-stream access to the event tables: a stream's events read with its latest snapshot and head hash, the
read before a command (the key's record and the stream, one round trip), one event's stored hash, a stream's
version, snapshots saved, idempotency records found. ``StreamReads`` is a part of ``EventRecorder``
(``recorder.py``), on the recorder's tables and connections.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from psycopg.rows import tuple_row

from commitline.application.chain import GENESIS
from commitline.application.ports import IdempotencyRecord
from commitline.infrastructure.store import pipelined
from commitline.infrastructure.store.pipelined import SYNC, Statement
from commitline.infrastructure.store.schema import EventTables


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


@dataclass
class CommandRead:
    """What ``read_for_command`` found: the key's record, the snapshot, the events after it or after the
    version the caller knew, and the hash of the last of them (None if it read neither)."""

    idempotency: IdempotencyRecord | None = None
    snapshot: Snapshot | None = None
    events: list[StoredEvent] = field(default_factory=list)
    head_hash: bytes | None = None


class StreamReads:
    """The per-stream part of ``EventRecorder``."""

    tables: EventTables
    _connection: Callable[[], Any]

    @cached_property
    def _stream_sql(self) -> _StreamStatements:
        return _StreamStatements(self.tables)

    def load_stream(self, aggregate_id: UUID, after_snapshot: bool) -> tuple[Snapshot | None, list[StoredEvent], bytes]:
        """The latest snapshot (if wanted, with the state of the stream's first event, which names its
        tenant), the events after it, and the stream's head hash: one statement, so the snapshot and the
        events come from the same database snapshot."""
        query = self._stream_sql.stream_after_snapshot if after_snapshot else self._stream_sql.stream_from_start
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
        steps = [(self._stream_sql.read_for_command, (aggregate_id, known_version, tenant, key, use_snapshot)), SYNC]
        with self._connection() as conn:
            (result, _) = pipelined.run(conn, steps)
            if pipelined.statements_lost(conn, [result]):
                (result, _) = pipelined.run(conn, steps)
            if not pipelined.ok(result):
                raise pipelined.error_of(result, conn.pgconn)  # type: ignore[arg-type]
        assert result is not None
        value = result.get_value
        read = CommandRead()
        int8, text = pipelined.int8, pipelined.text
        for row in range(result.ntuples):
            kind = int.from_bytes(value(row, 0), "big")  # type: ignore[arg-type]
            version, name, state, hashed = int8(value(row, 1)), text(value(row, 2)), bytes(value(row, 3)), bytes(
                value(row, 4))  # type: ignore[arg-type]
            if kind == 0:
                read.events.append(StoredEvent(aggregate_id, version, name, state))
                read.head_hash = hashed
            elif kind == 1:
                first = value(row, 5)
                read.snapshot = Snapshot(aggregate_id, version, name, state, hashed,
                                         bytes(first) if first is not None else None)
                read.head_hash = hashed
            else:
                read.idempotency = IdempotencyRecord(tenant, key, hashed, name, pipelined.uuid(value(row, 6)),
                                                     version, state)  # type: ignore[arg-type]
        return read

    def event_hash(self, aggregate_id: UUID, version: int) -> bytes:
        """The stored hash of one event; GENESIS for version 0 and for an event that does not exist
        (then the insert of the next version conflicts anyway)."""
        if version <= 0:
            return GENESIS
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(
                self._stream_sql.select_hash, (aggregate_id, version), prepare=True).fetchone()
        return bytes(row[0]) if row else GENESIS

    def stream_version(self, aggregate_id: UUID) -> int:
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(self._stream_sql.stream_head, (aggregate_id,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self._connection() as conn:
            conn.execute(
                self._stream_sql.insert_snapshot,
                (snapshot.aggregate_id, snapshot.version, snapshot.aggregate_type, snapshot.state, snapshot.event_hash),
            )

    def find_idempotency(self, tenant: str, key: str) -> IdempotencyRecord | None:
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(
                self._stream_sql.select_idempotency, (tenant, key), prepare=True).fetchone()
        if row is None:
            return None
        return IdempotencyRecord(tenant, key, bytes(row[0]), row[1], row[2], row[3], bytes(row[4]))


class _StreamStatements:
    def __init__(self, tables: EventTables):
        q = tables.sql
        self.select_hash = q("SELECT event_hash FROM {events} WHERE originator_id = %s AND originator_version = %s")
        self.select_idempotency = q(
            "SELECT fingerprint, command_type, aggregate_id, stream_version, outcome FROM {idem} "
            "WHERE tenant = %s AND key = %s"
        )
        self.stream_after_snapshot = q(
            "WITH s AS (SELECT version, aggregate_type, state, event_hash FROM {snaps} WHERE aggregate_id = %(id)s "
            "ORDER BY version DESC LIMIT 1) "
            "SELECT true, version, aggregate_type, state, event_hash, (SELECT state FROM {events} "
            "WHERE originator_id = %(id)s AND originator_version = 1) FROM s UNION ALL "
            "SELECT false, originator_version, topic, state, event_hash, NULL FROM {events} "
            "WHERE originator_id = %(id)s AND originator_version > coalesce((SELECT version FROM s), 0) "
            "ORDER BY 1 DESC, 2"
        )
        self.stream_from_start = q(
            "SELECT false, originator_version, topic, state, event_hash, NULL FROM {events} "
            "WHERE originator_id = %(id)s ORDER BY originator_version"
        )
        self.stream_head = q("SELECT max(originator_version) FROM {events} WHERE originator_id = %s")
        self.insert_snapshot = q(
            "INSERT INTO {snaps} (aggregate_id, version, aggregate_type, state, event_hash) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
        )
        # The command hot path (``pipelined``): one read per command, appends batched in one transaction.
        # Read: the key's record (kind 2), the latest snapshot if asked for (kind 1, with the first event's
        # state, which names the owner), and the events after both it and the version the caller knows (kind 0).
        self.read_for_command = Statement.of(q(
            "WITH s AS (SELECT version, aggregate_type, state, event_hash FROM {snaps} "
            "WHERE $5 AND aggregate_id = $1 AND version > $2 ORDER BY version DESC LIMIT 1) "
            "SELECT 2, stream_version, command_type, outcome, fingerprint, NULL::bytea, aggregate_id FROM {idem} "
            "WHERE tenant = $3 AND key = $4 UNION ALL "
            "SELECT 1, version, aggregate_type, state, event_hash, (SELECT state FROM {events} "
            "WHERE originator_id = $1 AND originator_version = 1), NULL::uuid FROM s UNION ALL "
            "SELECT 0, originator_version, topic, state, event_hash, NULL::bytea, NULL::uuid FROM {events} "
            "WHERE originator_id = $1 AND originator_version > greatest($2, coalesce((SELECT version FROM s), 0)) "
            "ORDER BY 1 DESC, 2"), ("uuid", "int8", "text", "text", "bool"))
