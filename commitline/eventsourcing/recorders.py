"""commitline's recorder behind eventsourcing's recorder interfaces.

- ``CommitlineApplicationRecorder``: ``EventRecorder`` (lock-free appends, gap-safe notification
  log, hash chains, append-only) on an application's own tables, with eventsourcing's constructor
  (``events_table_name``), so ``APPLICATION_RECORDER_TOPIC`` works with the stock factory too.
  Writes continue each stream's hash chain from the head it last read or wrote (no extra round
  trip for ``repository.get`` then ``save``). ``insert_events(..., idempotency_key=k)`` records
  ``k`` in the same transaction; a repeated key raises ``IdempotencyKeyUsed``, nothing written.
  A notification read that an unfinished write below its ids cut short waits (up to ``GAP_WAIT_S``) for that
  write to commit or roll back and reads again: eventsourcing's runners read only when prompted by a commit,
  and a write that rolls back prompts nobody, so returning at once could leave a follower waiting for the
  next write (commitline's own followers poll instead).
- ``CommitlineProcessRecorder``: the same plus the tracking record in the events' transaction.
- ``CommitlineTrackingRecorder``: eventsourcing's tracking recorder (nothing in it serialises
  writers), creating the schema when missing.
- ``CommitlineAggregateRecorder``: a plain table for snapshots (no notification ids, no chain).

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

from eventsourcing.persistence import ProcessRecorder, StoredEvent, Tracking
from eventsourcing.postgres import PostgresAggregateRecorder, PostgresDatastore, PostgresTrackingRecorder
from psycopg import errors as pg_errors
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.application.chain import chain
from commitline.eventsourcing import schema as tables
from commitline.eventsourcing.errors import IdempotencyKeyUsed
from commitline.infrastructure.store.recorder import EventRecorder, InTransaction

_REMEMBERED_HEADS = 100_000
GAP_WAIT_S = 2.0  # appends are short transactions: one below a read's ids ends well within this
GAP_POLL_S = 0.01


def _related_name(events_table_name: str, suffix: str) -> str:
    name = f"{events_table_name}_{suffix}"
    PostgresAggregateRecorder.check_identifier_length(name)
    return name


class CommitlineApplicationRecorder(EventRecorder):
    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events", **kwargs: Any):
        idempotency = _related_name(events_table_name, "idempotency")
        super().__init__(datastore, events_table=events_table_name, idempotency_table=idempotency,
                         originator_id_type=datastore.originator_id_type, **kwargs)
        schema, id_type = datastore.schema, datastore.originator_id_type
        self.sql_create_statements = [
            tables.events_table(schema, events_table_name, id_type),
            tables.notification_id_index(schema, events_table_name),
            *self._q.append_only_statements(),
            tables.idempotency_table(schema, idempotency),
        ]
        self._insert_key = SQL("INSERT INTO {} (key) VALUES (%s)").format(Identifier(schema, idempotency))
        self._select_key = SQL("SELECT 1 FROM {} WHERE key = %s").format(Identifier(schema, idempotency))
        self._select_events = SQL(
            "SELECT originator_id, originator_version, topic, state, event_hash FROM {} WHERE originator_id = %s"
        ).format(Identifier(schema, events_table_name))
        self._heads: OrderedDict[Any, tuple[int, bytes]] = OrderedDict()
        self._heads_lock = threading.Lock()

    def _connection(self) -> Any:
        return self.datastore.get_connection()

    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *, inclusive_of_start: bool = True) -> Sequence[Any]:
        deadline = time.monotonic() + GAP_WAIT_S
        while True:
            found, blocked = self.read_notifications(start, limit, stop, topics, inclusive_of_start=inclusive_of_start)
            if blocked is None or time.monotonic() >= deadline:
                return found
            time.sleep(GAP_POLL_S)

    def create_table(self) -> None:
        with self.datastore.transaction(commit=True) as curs:
            tables.lock_schema(curs, self.datastore.schema)
            self._create_table(curs)

    # -- writes -------------------------------------------------------------------

    def insert_events(self, stored_events: Sequence[StoredEvent], *, tracking: Tracking | None = None,
                      idempotency_key: str | None = None, **_: Any) -> Sequence[int] | None:
        hooks = [h for h in (self._tracking_hook(tracking), self._idempotency_hook(idempotency_key)) if h]
        if not stored_events and not hooks:
            return None
        links = self._links(stored_events)
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

    def _links(self, stored_events: Sequence[StoredEvent]) -> list[tuple[bytes, bytes]]:
        links: list[tuple[bytes, bytes]] = []
        heads: dict[Any, tuple[int, bytes]] = {}
        for e in stored_events:
            known = heads.get(e.originator_id)
            prev = known[1] if known and known[0] == e.originator_version - 1 else self._head_hash(
                e.originator_id, e.originator_version - 1)
            links.append(chain(prev, [e])[0])
            heads[e.originator_id] = (e.originator_version, links[-1][1])
        return links

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
        tables.ensure_schema(self.datastore)
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
        schema, id_type = datastore.schema, datastore.originator_id_type
        self.sql_create_statements = [tables.snapshots_table(schema, events_table_name, id_type)]
        self._insert = SQL(
            "INSERT INTO {} (originator_id, originator_version, topic, state) "
            "SELECT * FROM unnest(%s::{}[], %s::int8[], %s::text[], %s::bytea[])"
        ).format(Identifier(schema, events_table_name), SQL(id_type))

    def create_table(self) -> None:
        with self.datastore.transaction(commit=True) as curs:
            tables.lock_schema(curs, self.datastore.schema)
            self._create_table(curs)

    def insert_events(self, stored_events: Sequence[StoredEvent], **_: Any) -> Sequence[int] | None:
        if stored_events:
            params = ([e.originator_id for e in stored_events], [e.originator_version for e in stored_events],
                      [e.topic for e in stored_events], [e.state for e in stored_events])
            with self.datastore.get_connection() as conn:
                conn.execute(self._insert, params)
        return None


__all__: Sequence[str] = ("CommitlineAggregateRecorder", "CommitlineApplicationRecorder", "CommitlineProcessRecorder",
                          "CommitlineTrackingRecorder")
