"""commitline's recorder behind eventsourcing's recorder interfaces.

- ``CommitlineApplicationRecorder``: ``EventRecorder`` (lock-free appends, gap-safe notification
  log, hash chains, append-only) on an application's own tables, with eventsourcing's constructor
  (``events_table_name``), so ``APPLICATION_RECORDER_TOPIC`` works with the stock factory too.
  Writes continue each stream's hash chain from the head it last read or wrote (no extra round
  trip for ``repository.get`` then ``save``); unlike commitline's own appends they do not prove the
  predecessor is stored (the library's contract: unique versions, a stream beginning at any version). ``insert_events(..., idempotency_key=k)`` records
  ``k`` in the same transaction; a repeated key raises ``IdempotencyKeyUsed``, nothing written.
  A notification read that an unfinished write below its ids cut short waits (up to ``GAP_WAIT_S``) for that
  write to commit or roll back and reads again: eventsourcing's runners read only when prompted by a commit,
  and a write that rolls back prompts nobody, so returning at once could leave a follower waiting for the
  next write (commitline's own followers poll instead).
- ``CommitlineProcessRecorder``: the same plus the tracking record in the events' transaction.
- ``CommitlineTrackingRecorder``: eventsourcing's tracking recorder (nothing in it serialises
  writers), creating the schema when missing.
- ``CommitlineAggregateRecorder``: a plain table for snapshots (no notification ids, no chain).

Every table is defined by ``EventTables`` (``infrastructure/store/schema.py``, in its eventsourcing layouts), the
definition of the store's own tables, so an application's events table cannot differ from commitline's.

Connections come from eventsourcing's ``PostgresDatastore.get_connection``, which turns every
psycopg error into eventsourcing's type (``IntegrityError`` for a conflicting version, ...).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import (
    InterfaceError,
    OperationalError,
    ProcessRecorder,
    ProgrammingError,
    StoredEvent,
    Tracking,
)
from eventsourcing.postgres import PostgresAggregateRecorder, PostgresDatastore, PostgresTrackingRecorder
from eventsourcing.utils import retry
from psycopg import errors as pg_errors
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import SQL, Composed

from commitline.application.chain import chain_streams
from commitline.eventsourcing.errors import IdempotencyKeyUsed
from commitline.infrastructure.store.log import first_id
from commitline.infrastructure.store.recorder import EventRecorder, InTransaction
from commitline.infrastructure.store.schema import EventTables, lock_schema

_REMEMBERED_HEADS = 100_000
GAP_WAIT_S = 2.0  # appends are short transactions: one below a read's ids ends well within this
GAP_POLL_S = 0.01
GAP_POLL_MAX_S = 0.2
#: As eventsourcing's own recorders: a connection the server dropped (a restart, a failover, an idle timeout)
#: fails its call, and the call is made again on another, up to ten times, 0.2 s apart.
_reconnecting = retry((InterfaceError, OperationalError, psycopg.InterfaceError, psycopg.OperationalError),
                      max_attempts=10, wait=0.2)


def _create_tables(recorder: PostgresAggregateRecorder) -> None:
    """The recorder's tables, under the schema's DDL lock (the schema created when missing)."""
    with recorder.datastore.transaction(commit=True) as curs:
        lock_schema(curs, recorder.datastore.schema)
        recorder._create_table(curs)


class CommitlineApplicationRecorder(EventRecorder):
    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events", **kwargs: Any):
        tables = EventTables.of_application(datastore.schema, events_table_name, datastore.originator_id_type)
        PostgresAggregateRecorder.check_identifier_length(tables.idempotency)
        super().__init__(datastore, tables=tables, **kwargs)
        self.sql_create_statements = tables.event_statements()  # snapshots are the aggregate recorder's
        self._insert_key = tables.sql("INSERT INTO {idem} (key) VALUES (%s)")
        self._select_key = tables.sql("SELECT 1 FROM {idem} WHERE key = %s")
        self._select_events = tables.sql(
            "SELECT originator_id, originator_version, topic, state, event_hash FROM {events} WHERE originator_id = %s")
        self._heads: OrderedDict[Any, tuple[int, bytes]] = OrderedDict()
        self._heads_lock = threading.Lock()

    def _connection(self) -> Any:
        return self.datastore.get_connection()

    @_reconnecting
    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *, inclusive_of_start: bool = True) -> Sequence[Any]:
        deadline = time.monotonic() + GAP_WAIT_S
        pause = GAP_POLL_S
        while True:
            found, blocked = self.log.read(first_id(start, inclusive_of_start), limit, stop, topics)
            if blocked is None or time.monotonic() >= deadline:
                return found
            time.sleep(pause)
            pause = min(pause * 2, GAP_POLL_MAX_S)  # each look reads the page again: fewer the longer it waits

    @_reconnecting
    def max_notification_id(self) -> int | None:
        return super().max_notification_id()

    def create_table(self) -> None:
        self._refuse_stock_table()
        _create_tables(self)

    def _refuse_stock_table(self) -> None:
        """An events table eventsourcing's own module made (no hash chain) is not this module's to use: say so
        now, before anything is created beside it, not as a missing column at the first load or save."""
        schema = self.datastore.schema or "public"
        name = self.tables.events
        with self.datastore.get_connection() as conn:
            columns = {r[0] for r in conn.cursor(row_factory=tuple_row).execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                (schema, name)).fetchall()}
        if columns and "event_hash" not in columns:
            raise ProgrammingError(
                f"table {schema}.{name} was made by eventsourcing's own persistence module: commitline.eventsourcing "
                "does not convert it in place (its events table is hash-chained and append-only); give the "
                "application a new name or POSTGRES_SCHEMA, or keep PERSISTENCE_MODULE=eventsourcing.postgres")

    # -- writes -------------------------------------------------------------------

    @_reconnecting
    def insert_events(self, stored_events: Sequence[StoredEvent], *, tracking: Tracking | None = None,
                      idempotency_key: str | None = None, **_: Any) -> Sequence[int] | None:
        hooks = [h for h in (self._tracking_hook(tracking), self._idempotency_hook(idempotency_key)) if h]
        if not stored_events and not hooks:
            return None
        links = chain_streams(stored_events, self._head_hash)
        ids = self.append(stored_events, links=links, in_transaction=_all(hooks) if hooks else None)
        for event, (_, event_hash) in zip(stored_events, links, strict=True):
            self._remember(event.originator_id, event.originator_version, event_hash)
        return ids

    def idempotency_key_recorded(self, key: str) -> bool:
        with self._connection() as conn:
            return conn.cursor(row_factory=tuple_row).execute(self._select_key, (key,)).fetchone() is not None

    def _tracking_hook(self, tracking: Tracking | None) -> InTransaction | None:
        return None  # an application recorder keeps no tracking records (as eventsourcing's own)

    def _idempotency_hook(self, key: str | None) -> InTransaction | None:
        if key is None:
            return None

        def record_key(conn: Any) -> None:
            try:
                conn.execute(self._insert_key, (key,))
            except pg_errors.UniqueViolation:
                raise IdempotencyKeyUsed(key) from None

        return record_key

    def _head_hash(self, originator_id: UUID | str, version: int) -> bytes:
        with self._heads_lock:
            known = self._heads.get(originator_id)
        if known is not None and known[0] == version:
            return known[1]
        return self.event_hash(originator_id, version)  # type: ignore[arg-type]

    def _remember(self, originator_id: Any, version: int, event_hash: bytes) -> None:
        with self._heads_lock:
            known = self._heads.get(originator_id)
            if known is None or known[0] <= version:
                self._heads[originator_id] = (version, event_hash)
                self._heads.move_to_end(originator_id)
            while len(self._heads) > _REMEMBERED_HEADS:
                self._heads.popitem(last=False)

    # -- per-stream reads ---------------------------------------------------------

    @_reconnecting
    def select_events(self, originator_id: UUID | str, *, gt: int | None = None, lte: int | None = None,
                      desc: bool = False, limit: int | None = None) -> Sequence[StoredEvent]:
        statement: Composed = self._select_events
        params: list[Any] = [originator_id]
        if gt is not None:
            statement += SQL(" AND originator_version > %s")
            params.append(gt)
        if lte is not None:
            statement += SQL(" AND originator_version <= %s")
            params.append(lte)
        statement += SQL(" ORDER BY originator_version DESC" if desc else " ORDER BY originator_version ASC")
        if limit is not None:
            statement += SQL(" LIMIT %s")
            params.append(limit)
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(statement, params, prepare=True).fetchall()
        if rows:
            top = max(rows, key=lambda r: r[1])
            self._remember(top[0], top[1], bytes(top[4]))
        return [StoredEvent(originator_id=r[0], originator_version=r[1], topic=r[2], state=bytes(r[3])) for r in rows]


def _all(hooks: list[InTransaction]) -> InTransaction:
    def run(conn: Any) -> None:
        for hook in hooks:
            hook(conn)

    return run


class CommitlineTrackingRecorder(PostgresTrackingRecorder):
    def create_table(self) -> None:
        with self.datastore.transaction(commit=True) as curs:
            lock_schema(curs, self.datastore.schema)
        super().create_table()


class CommitlineProcessRecorder(CommitlineTrackingRecorder, CommitlineApplicationRecorder, ProcessRecorder):
    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events",
                 tracking_table_name: str = "notification_tracking"):
        super().__init__(datastore, tracking_table_name=tracking_table_name, events_table_name=events_table_name)

    def _tracking_hook(self, tracking: Tracking | None) -> InTransaction | None:
        if tracking is None:
            return None

        def record_position(conn: Any) -> None:
            with conn.cursor(row_factory=dict_row) as curs:
                self._insert_tracking(curs, tracking)  # IntegrityError unless above the recorded position

        return record_position


class CommitlineAggregateRecorder(PostgresAggregateRecorder):
    """Snapshots: a plain table, inserted without composite types."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"):
        super().__init__(datastore, events_table_name=events_table_name)
        tables = EventTables(datastore.schema, snapshots=events_table_name, id_type=datastore.originator_id_type,
                             eventsourcing=True)
        self.sql_create_statements = [tables.snapshots_table()]
        self._insert = tables.sql("INSERT INTO {snaps} (originator_id, originator_version, topic, state) "
                                  "SELECT * FROM unnest(%s::{id_type}[], %s::int8[], %s::text[], %s::bytea[])")

    def create_table(self) -> None:
        _create_tables(self)

    @_reconnecting
    def insert_events(self, stored_events: Sequence[StoredEvent], **_: Any) -> Sequence[int] | None:
        if stored_events:
            params = ([e.originator_id for e in stored_events], [e.originator_version for e in stored_events],
                      [e.topic for e in stored_events], [e.state for e in stored_events])
            with self.datastore.get_connection() as conn:
                conn.execute(self._insert, params)
        return None


__all__: Sequence[str] = ("CommitlineAggregateRecorder", "CommitlineApplicationRecorder", "CommitlineProcessRecorder",
                          "CommitlineTrackingRecorder")
