"""The audit's view of the PostgreSQL store: streams decoded for history, raw chain records
streamed in pages for verification, and the versions idempotency records witnessed.

The pages are read by a thread of their own, one page ahead of the verifier: while it hashes a
page, the next is fetched (PostgreSQL works and the rows cross the socket meanwhile). Still one
server-side cursor in one transaction: one consistent snapshot of the whole store."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from uuid import UUID

from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.application.audit import ChainRecord, StoredHistoryEvent
from commitline.infrastructure.store.codec import EventCodec
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.store.schema import EVENTS_TABLE, IDEMPOTENCY_TABLE

PAGE = 10_000
AHEAD = 2  # pages read ahead of the verifier at most
_END = object()


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

    def first_state(self, aggregate_id: UUID) -> bytes | None:
        with self.datastore.get_connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(SQL(
                "SELECT state FROM {} WHERE originator_id = %s ORDER BY originator_version LIMIT 1"
            ).format(self.events), (aggregate_id,)).fetchone()
        return bytes(row[0]) if row else None

    def chain_pages(self, aggregate_id: UUID | None) -> Iterator[Sequence[ChainRecord]]:
        """Pages of rows (``ChainRecord``'s fields, in order), read ahead by a thread; stopping early (closing
        the iterator) stops the read."""
        pages: queue.Queue[Any] = queue.Queue(AHEAD)
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    pages.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def read() -> None:
            try:
                for page in self._read_pages(aggregate_id):
                    if not put(page):
                        return
                put(_END)
            except BaseException as e:  # handed to the verifier, raised there
                put(e)

        reader = threading.Thread(target=read, name="commitline-audit-read", daemon=True)
        reader.start()
        try:
            while (item := pages.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            reader.join()

    def _read_pages(self, aggregate_id: UUID | None) -> Iterator[list[tuple[Any, ...]]]:
        where = SQL("WHERE originator_id = %s") if aggregate_id is not None else SQL("")
        query = SQL("SELECT originator_id, originator_version, topic, state, prev_hash, event_hash FROM {} {} "
                    "ORDER BY originator_id, originator_version").format(self.events, where)
        with self.datastore.get_connection() as conn, conn.transaction():
            # A server-side cursor streams a store of any size in pages, in one consistent snapshot.
            with conn.cursor(name="commitline_audit_verify", row_factory=tuple_row) as cur:
                cur.execute(query, (aggregate_id,) if aggregate_id is not None else ())
                while page := cur.fetchmany(PAGE):
                    yield page

    def witnessed_versions(self, aggregate_id: UUID | None) -> Mapping[UUID, int]:
        where = SQL("WHERE aggregate_id = %s") if aggregate_id is not None else SQL("")
        with self.datastore.get_connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(SQL(
                "SELECT aggregate_id, max(stream_version) FROM {} {} GROUP BY aggregate_id"
            ).format(self.idempotency, where), (aggregate_id,) if aggregate_id is not None else ()).fetchall()
        return {a: int(v) for a, v in rows}

    def witnessing_tenant(self, aggregate_id: UUID) -> str | None:
        with self.datastore.get_connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(
                SQL("SELECT tenant FROM {} WHERE aggregate_id = %s LIMIT 1").format(self.idempotency),
                (aggregate_id,)).fetchone()
        return str(row[0]) if row is not None else None

    def event_count(self) -> int:
        with self.datastore.get_connection() as conn:
            return int(conn.cursor(row_factory=tuple_row).execute(
                SQL("SELECT count(*) FROM {}").format(self.events)).fetchone()[0])
