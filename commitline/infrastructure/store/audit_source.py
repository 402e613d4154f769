"""The audit's view of the PostgreSQL store: streams decoded for history, raw chain records
streamed in pages for verification, and the versions idempotency records witnessed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from uuid import UUID

from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.application.audit import ChainRecord, StoredHistoryEvent
from commitline.infrastructure.store.codec import EventCodec
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.store.schema import EVENTS_TABLE, IDEMPOTENCY_TABLE

PAGE = 10_000


class PostgresAuditSource:
    def __init__(self, recorder: EventRecorder, codec: EventCodec):
        self.datastore = recorder.datastore
        self.codec = codec
        self.events = Identifier(self.datastore.schema, EVENTS_TABLE)
        self.idempotency = Identifier(self.datastore.schema, IDEMPOTENCY_TABLE)

    def stream(self, aggregate_id: UUID) -> list[StoredHistoryEvent]:
        with self.datastore.get_connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(SQL(
                "SELECT originator_version, topic, state FROM {} WHERE originator_id = %s ORDER BY originator_version"
            ).format(self.events), (aggregate_id,)).fetchall()
        decoded = [self.codec.decode_event(topic, aggregate_id, version, bytes(state)) for version, topic, state in rows]
        return [StoredHistoryEvent(r.event, r.aggregate_type, r.tenant) for r in decoded]

    def chain_records(self, aggregate_id: UUID | None) -> Iterator[ChainRecord]:
        where = SQL("WHERE originator_id = %s") if aggregate_id is not None else SQL("")
        query = SQL("SELECT originator_id, originator_version, topic, state, prev_hash, event_hash FROM {} {} "
                    "ORDER BY originator_id, originator_version").format(self.events, where)
        with self.datastore.get_connection() as conn, conn.transaction():
            # A server-side cursor streams a store of any size in pages, in one consistent snapshot.
            with conn.cursor(name="commitline_audit_verify", row_factory=tuple_row) as cur:
                cur.itersize = PAGE
                cur.execute(query, (aggregate_id,) if aggregate_id is not None else ())
                for row in cur:
                    yield ChainRecord(row[0], row[1], row[2], bytes(row[3]), bytes(row[4]), bytes(row[5]))

    def witnessed_versions(self, aggregate_id: UUID | None) -> Mapping[UUID, int]:
        where = SQL("WHERE aggregate_id = %s") if aggregate_id is not None else SQL("")
        with self.datastore.get_connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(SQL(
                "SELECT aggregate_id, max(stream_version) FROM {} {} GROUP BY aggregate_id"
            ).format(self.idempotency, where), (aggregate_id,) if aggregate_id is not None else ()).fetchall()
        return {a: int(v) for a, v in rows}

    def event_count(self) -> int:
        with self.datastore.get_connection() as conn:
            return int(conn.cursor(row_factory=tuple_row).execute(
                SQL("SELECT count(*) FROM {}").format(self.events)).fetchone()[0])
