"""The append-only PostgreSQL event store's recorder: its appends; its per-stream reads (``streams.py``) and
its notification log (``log.py``) are parts of it, on its tables (``schema.py``) and statements
(``statements.py``).

Built on ``eventsourcing``'s ``PostgresApplicationRecorder`` (its datastore, pool, event and notification
types, LISTEN subscription), with three changes:

1. **No table lock on append.** The stock recorder takes ``LOCK TABLE ... EXCLUSIVE`` on every insert so
   notification ids commit in order; that serialises every writer, fsync included. Here writers run in
   parallel and the *reader* proves gaps instead: every writer assigns itself a transaction id before it
   draws notification ids, which is what the proof needs (``log.py`` says how; ``select_notifications``
   and ``max_notification_id`` are the recorder's ``NotificationLog``).
2. **Append-only for real, plus idempotency in the same transaction.** Triggers reject UPDATE, DELETE and
   TRUNCATE on events (``schema.py`` defines the tables); the idempotency record is inserted in the events'
   transaction, so both commit or neither does. On commitline's tables an append proves its predecessor in
   the same statement (``EventTables.continues``): version N only on version N-1 as stored, with the hash the
   events chain from; refused, it raises ``PredecessorMissing`` and writes nothing (not even the key). The
   data keys of the command's new data subjects go in with the events too (``SubjectKeyTaken`` when a subject
   got its key first; ``statements.py``).
3. **Two append paths.** ``append``: one transaction per call, in one round trip when small (a command
   without group commit, an ``eventsourcing`` write). ``append_batch``: the group commit, several commands in
   one transaction and one round trip, each atomic on its own (the store's append function).

Wake-ups: after a successful append the writer sends ``NOTIFY`` outside the event transaction. (``NOTIFY``
inside a transaction takes a database-wide lock until commit ends, which would serialise commits again.)
Followers also poll, so a lost wake-up only delays them; so does ``subscribe()``
(``subscription.PollingSubscription``). Table names are parameters (commitline's own are ``events``,
``idempotency_keys``, ``snapshots``; ``commitline.eventsourcing`` uses one set per application).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eventsourcing.persistence import Notification, StoredEvent, Subscription
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from typing_extensions import Self

from commitline.application.chain import chain_streams
from commitline.application.errors import StoreUnavailable
from commitline.application.ports import IdempotencyRecord, KeyAlreadyRecorded, PredecessorMissing, StreamMoved
from commitline.infrastructure.personal.keys import RETIRED_MASTER_KEY, retired_master
from commitline.infrastructure.store import pipelined
from commitline.infrastructure.store.datastore import StoreDatastore
from commitline.infrastructure.store.log import NotificationLog, Scan, first_id
from commitline.infrastructure.store.pipelined import SYNC
from commitline.infrastructure.store.schema import DATA_KEYS_TABLE, EventTables, lock_schema
from commitline.infrastructure.store.statements import Statements
from commitline.infrastructure.store.streams import StreamReads
from commitline.infrastructure.store.subscription import PollingSubscription

if TYPE_CHECKING:
    from commitline.infrastructure.personal.keys import KeyRow

# Appends whose event states add up to more than this are sent statement by statement instead of in
# one pipeline. psycopg's pipeline stops flushing once its last command is queued and then waits only
# for replies; what the kernel's socket buffers could not take by then is never sent, so the server
# waits for the rest of the message and the client for a reply, forever, with the transaction open.
# Below Linux's initial TCP send buffer (16 KiB, net.ipv4.tcp_wmem) everything is always taken at once.
PIPELINE_MAX_BYTES = 8 * 1024
#: A hook run inside an append's transaction, after the writer's xid and before the events (with the
#: connection): e.g. an ``eventsourcing`` tracking record. Its error rolls the whole append back.
InTransaction = Callable[[Any], None]


class SubjectKeyTaken(StreamMoved):
    """Raised by ``append`` when a data key it was to insert (a new data subject's) is refused: the subject got
    a key first. Nothing was written; the events are to be sealed again, under the key the subject has."""


@dataclass(frozen=True)
class PendingAppend:
    """One command's append, waiting to go out in a batch (``append_batch``)."""

    events: Sequence[StoredEvent]
    idempotency: IdempotencyRecord | None
    links: Sequence[tuple[bytes, bytes]]
    trace: Any = None  # the append's span when tracing is on (``infrastructure/tracing.AppendTrace``)
    #: the data keys the events are sealed under that are not stored yet, inserted with them
    keys: Sequence[KeyRow] = ()

    @property
    def size(self) -> int:
        return sum(len(e.state) for e in self.events)


class EventRecorder(StreamReads, PostgresApplicationRecorder):
    datastore: StoreDatastore
    #: Seconds between a subscription's polls when no wake-up arrives (it also re-reads after a gap).
    subscription_poll_interval = 0.25

    def __init__(self, datastore: StoreDatastore | PostgresDatastore, *, tables: EventTables | None = None):
        """``tables``: commitline's own (``events``, ``idempotency_keys``, ``snapshots``) unless given."""
        self.tables = tables or EventTables(datastore.schema)
        super().__init__(datastore, events_table_name=self.tables.events)
        self._q = Statements(self.tables)
        self.sql_create_statements = self.tables.create_statements() + (
            [] if self.tables.eventsourcing else self.tables.idempotency_references())
        self.channel_name = self.tables.channel
        self.log = NotificationLog(self.tables, self._connection)
        # Test seam for crash-safety tests: runs inside the append transaction,
        # after the inserts and before COMMIT.
        self.before_commit: Callable[[], None] | None = None
        # Test seam for the batch path: runs between two commands of a batch (given how many are inserted).
        self.between_commands: Callable[[int], None] | None = None

    def create_table(self) -> None:
        with self.datastore.get_connection() as conn, conn.transaction():
            lock_schema(conn, self.datastore.schema)
            for statement in self.sql_create_statements:
                conn.execute(statement)

    def _connection(self) -> Any:
        """A pooled connection: commitline's fast path (``StoreDatastore.connection``, failures as
        ``StoreUnavailable``); ``commitline.eventsourcing`` uses eventsourcing's own, whose failures are
        eventsourcing's exception types."""
        return self.datastore.connection()

    def _batch_connection(self) -> Any:
        """A group-commit batch's connection: one the datastore keeps between batches where it can."""
        if isinstance(self.datastore, StoreDatastore):
            return self.datastore.kept_connection()
        return self._connection()

    # -- writes -------------------------------------------------------------------

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """eventsourcing's ``ApplicationRecorder`` write: the same lock-free, hash-chained ``append``."""
        unknown = sorted(k for k, v in kwargs.items() if v is not None)
        if unknown:
            raise TypeError(f"EventRecorder.insert_events does not take {', '.join(unknown)} "
                            "(tracking needs commitline.eventsourcing's process recorder)")
        return self.append(stored_events) if stored_events else None

    def append(self, stored_events: Sequence[StoredEvent], idempotency: IdempotencyRecord | None = None,
               links: Sequence[tuple[bytes, bytes]] | None = None, *,
               in_transaction: InTransaction | None = None, keys: Sequence[KeyRow] = ()) -> list[int]:
        """Insert events (and the idempotency record) in one transaction; return their notification ids.

        ``links`` are the events' (prev_hash, event_hash) pairs (``chain.chain``). When not given they are
        computed per stream, each continuing from the stored hash of the event before its first one
        (``chain.chain_streams``).
        ``in_transaction`` runs in the same transaction before the inserts (statement by statement).
        ``keys``: data keys to insert with the events (commitline's tables only), ``SubjectKeyTaken`` if one's
        subject has a key already."""
        if links is None:
            links = chain_streams(stored_events, self.event_hash)
        params = _event_arrays(stored_events, links)
        statement = self._q.insert_proven or self._q.insert_events
        if self._q.insert_proven is not None:  # the key's record goes in with the events (``statements.py``)
            params += _idempotency_params(idempotency) if idempotency is not None else (None,) * 9
            idempotency = None
            if keys:
                statement, params = self._q.insert_proven_keyed, params + _key_arrays(keys)
        elif keys:
            raise ValueError("an eventsourcing application's tables take no data keys with their events")
        size = sum(len(e.state) for e in stored_events)
        one_trip = size <= PIPELINE_MAX_BYTES and in_transaction is None

        def insert(conn: Any) -> list[int]:
            if one_trip:
                ids = self._insert_in_one_round_trip(conn, statement, params, idempotency)
            else:
                ids = self._insert_in_steps(conn, statement, params, idempotency, in_transaction, len(stored_events))
            if len(ids) != len(stored_events):  # committed nothing (the steps' COMMIT was not even sent)
                raise _unproven(stored_events[0])
            return ids

        try:
            with self._connection() as conn:
                try:
                    ids = insert(conn)
                except BaseException:
                    # A broken connection (UNKNOWN) has no transaction left to roll back: the server ended it.
                    if conn.info.transaction_status not in (TransactionStatus.IDLE, TransactionStatus.UNKNOWN):
                        conn.rollback()
                    raise
        except pg_errors.UniqueViolation as e:
            raise self._refusal(e) from None
        return ids

    def record_key(self, idempotency: IdempotencyRecord) -> None:
        """The key's record of a command that decided no events, alone in its own transaction (nothing to prove
        against a stream, and no notification: the log does not change); ``KeyAlreadyRecorded`` if a twin holds it."""
        try:
            with self._connection() as conn, conn.transaction():
                conn.execute(self._q.insert_idempotency, _idempotency_params(idempotency))
        except pg_errors.UniqueViolation as e:
            raise self._refusal(e) from None

    def _refusal(self, error: pg_errors.Error) -> Exception:
        """What an insert's failure means for its command: a twin holds the key, the stream moved, or
        the error itself (deadlock and serialization failures mean another writer took the version; a foreign key
        violation is the append functions' refusal of an event that does not prove its predecessor)."""
        if isinstance(error, pg_errors.UniqueViolation):
            return self._taken(error.diag.constraint_name or "")
        if error.sqlstate == RETIRED_MASTER_KEY:
            return self._refused(RETIRED_MASTER_KEY, error.diag.message_primary or "")
        if isinstance(error, pg_errors.ForeignKeyViolation):
            return PredecessorMissing(str(error))
        if isinstance(error, (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)):
            return StreamMoved(type(error).__name__)
        return error

    def append_batch(self, batch: Sequence[PendingAppend]) -> list[list[int] | Exception]:
        """Several commands' appends in ONE transaction and one round trip, each atomic on its own: per
        command its notification ids, or what refused it (``KeyAlreadyRecorded``, ``StreamMoved``, ...),
        which never touches the others. Each command is one call of the store's append function
        (migration 6), whose exception block is a subtransaction: a command that fails is undone alone
        and reported in the call's result, so the server never skips the rest and one sync ends the
        whole batch. Nothing is acknowledged before COMMIT succeeded; if it fails, the whole batch raises.

        The writer's xid is drawn before any notification id, as in ``append`` (the gap proof): the append
        function takes it first (the transaction's own, not a subtransaction's, and it stays if that rolls back)."""
        q = self._q
        steps: list[pipelined.Step] = [b"BEGIN"]
        calls: list[int] = []
        for k, pending in enumerate(batch):
            calls.append(len(steps))
            one = len(pending.events) == 1
            if pending.keys:
                steps.append((q.append_one_keyed if one else q.append_keyed, _append_params(pending, one)))
            else:
                steps.append((q.append_one if one else q.append_command, _append_params(pending, one)))
            if self.between_commands is not None and k < len(batch) - 1:
                steps.append(lambda k=k: self.between_commands(k + 1))  # type: ignore[misc]
        if self.before_commit is not None:
            steps.append(self.before_commit)
        commit = len(steps)
        steps += [b"COMMIT", q.notify_bytes, SYNC]
        try:
            with self._batch_connection() as conn:
                results = pipelined.run(conn, steps)
                if not pipelined.committed(results[commit]) and pipelined.statements_lost(conn, results):
                    if conn.pgconn.transaction_status != TransactionStatus.IDLE:
                        conn.rollback()
                    results = pipelined.run(conn, steps)  # nothing ran: the first prepared statement failed
                return self._batch_outcomes(conn, calls, results, results[commit])
        except pg_errors.UndefinedFunction:  # raised by the function's PREPARE, before anything ran
            needed = 13 if any(p.keys for p in batch) else 6  # 13: the keyed functions (a new data subject's key)
            raise StoreUnavailable(f"the schema {self.datastore.schema} has no append function: it lacks "
                                   f"migration {needed}; run commitline migrate") from None

    def _batch_outcomes(self, conn: Any, calls: list[int], results: list[Any],
                        commit: Any) -> list[list[int] | Exception]:
        if not pipelined.committed(commit):
            failed = next((r for r in results if r is not None and r.status == pipelined.FATAL), commit)
            if conn.pgconn.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            if failed is not None and failed.status == pipelined.FATAL:
                raise pipelined.error_of(failed, conn.pgconn)
            raise pg_errors.InFailedSqlTransaction("the batch's transaction failed before COMMIT")
        outcomes: list[list[int] | Exception] = []
        for step in calls:
            reply = results[step]
            if not pipelined.ok(reply) or reply.ntuples != 1:  # cannot happen after a COMMIT: never acknowledge
                outcomes.append(pg_errors.InFailedSqlTransaction("the command's append did not run"))
                continue
            refused = reply.get_value(0, 1)
            if refused is None:
                outcomes.append(pipelined.int8_array(reply.get_value(0, 0)))
            else:
                outcomes.append(self._refused(pipelined.text(refused), pipelined.text(reply.get_value(0, 2) or b"")))
        return outcomes

    def _refused(self, sqlstate: str, detail: str) -> Exception:
        """What the append function's caught error (its SQLSTATE, and the constraint of a unique violation,
        else the message) means for the command, as ``_refusal`` says for a raised one."""
        if sqlstate == "23505":  # unique_violation: ``detail`` is the constraint
            return self._taken(detail)
        if sqlstate == RETIRED_MASTER_KEY:
            return retired_master(detail.split()[3] if detail.startswith("the master key ") else "?")
        try:
            kind = pg_errors.lookup(sqlstate)
        except KeyError:  # a code psycopg does not know (a custom one raised by a trigger, a newer server's)
            kind = pg_errors.DatabaseError
        return self._refusal(kind(f"{detail} (SQLSTATE {sqlstate})"))

    def _taken(self, constraint: str) -> Exception:
        """A unique violation on ``constraint``: a twin holds the key, or another writer took the version."""
        if constraint.startswith(self.tables.idempotency):
            return KeyAlreadyRecorded(constraint)
        if constraint.startswith(DATA_KEYS_TABLE):
            return SubjectKeyTaken(constraint)
        return StreamMoved(constraint)

    def _insert_in_one_round_trip(self, conn: Any, statement: Any, params: tuple[Any, ...],
                                  idempotency: IdempotencyRecord | None) -> list[int]:
        # BEGIN ... COMMIT and the wake-up NOTIFY after it go out in one pipeline sync: one round
        # trip per append. On an error the server skips the rest of the pipeline (the COMMIT
        # included) and the caller rolls the open transaction back.
        with conn.pipeline() as pipeline:
            cur = conn.cursor(row_factory=tuple_row)
            inserted = conn.cursor(row_factory=tuple_row)
            cur.execute("BEGIN")
            cur.execute(self._q.assign_xid)
            if idempotency is not None:
                cur.execute(self._q.insert_idempotency, _idempotency_params(idempotency))
            inserted.execute(statement, params, prepare=True)
            if self.before_commit is not None:
                pipeline.sync()
                self.before_commit()
            cur.execute("COMMIT")
            cur.execute(self._q.notify)
            pipeline.sync()
            return [row[0] for row in inserted.fetchall()]

    def _insert_in_steps(self, conn: Any, statement: Any, params: tuple[Any, ...],
                         idempotency: IdempotencyRecord | None,
                         in_transaction: InTransaction | None, events: int) -> list[int]:
        # The same statements without the pipeline: each one is sent completely before its reply is awaited.
        cur = conn.cursor(row_factory=tuple_row)
        cur.execute("BEGIN")
        cur.execute(self._q.assign_xid)
        if in_transaction is not None:
            in_transaction(conn)
        if idempotency is not None:
            cur.execute(self._q.insert_idempotency, _idempotency_params(idempotency))
        ids = [row[0] for row in cur.execute(statement, params).fetchall()]
        if len(ids) != events:
            return ids  # refused: no COMMIT (``append`` raises, and rolls back)
        if self.before_commit is not None:
            self.before_commit()
        cur.execute("COMMIT")
        cur.execute(self._q.notify)
        return ids

    # -- the notification log (``log.py``) -----------------------------------------

    def select_notifications(self, start: int | None, limit: int, stop: int | None = None, topics: Sequence[str] = (),
                             *, inclusive_of_start: bool = True) -> Sequence[Notification]:
        """Notifications from ``start`` in id order, ending before any gap not yet proven permanent.

        With ``topics``, up to ``limit`` notifications of those topics (filtered before the limit)."""
        return self.log.read(first_id(start, inclusive_of_start), limit, stop, topics)[0]

    def scan_notifications(self, first: int, limit: int, passed_over: Sequence[str]) -> Scan:
        """The next ``limit`` events from id ``first`` without those of the types ``passed_over``, and how far
        the log is proven read (``NotificationLog.scan``)."""
        return self.log.scan(max(first, 1), limit, passed_over)

    def max_notification_id(self) -> int | None:
        return self.log.max_id()

    def topic_counts(self) -> dict[str, int]:
        """Events per stored type: estimated from the planner's statistics of the events table (free, and as
        fresh as its last ANALYZE, which autovacuum runs), counted when it has none yet."""
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(
                "SELECT most_common_vals::text::text[], most_common_freqs, "
                "(SELECT c.reltuples FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s) "
                "FROM pg_stats WHERE schemaname = %s AND tablename = %s AND attname = 'topic'",
                (self.tables.schema, self.tables.events, self.tables.schema, self.tables.events)).fetchone()
            if row is not None and row[0] is not None and row[2] is not None and row[2] > 0:
                return {topic: round(freq * row[2]) for topic, freq in zip(row[0], row[1])}
            rows = conn.cursor(row_factory=tuple_row).execute(
                self.tables.sql("SELECT topic, count(*) FROM {events} GROUP BY topic")).fetchall()
        return {topic: count for topic, count in rows}

    def subscribe(self, gt: int | None = None, topics: Sequence[str] = ()) -> Subscription[Self]:  # type: ignore[override]
        """Notifications after ``gt`` as they commit: woken by NOTIFY, and polling every
        ``subscription_poll_interval`` s, so a gap left by an aborted write is passed without another write."""
        return PollingSubscription(self, gt=gt, topics=topics, poll_interval=self.subscription_poll_interval)


def _unproven(first: StoredEvent) -> PredecessorMissing:
    return PredecessorMissing(f"the append to stream {first.originator_id} from version {first.originator_version} "
                              "does not continue the stream's stored history: an event's predecessor is not stored "
                              "with the hash it chains from")


def _append_params(pending: PendingAppend, one: bool) -> tuple[Any, ...]:
    key = _idempotency_params(pending.idempotency) if pending.idempotency is not None else (None,) * 9
    if pending.keys:
        key += _key_arrays(pending.keys)
    if one:
        e, (prev, this) = pending.events[0], pending.links[0]
        return (*key, e.originator_id, e.originator_version, e.topic, e.state, prev, this)
    return (*key, *_event_arrays(pending.events, pending.links))


def _event_arrays(events: Sequence[StoredEvent], links: Sequence[tuple[bytes, bytes]]) -> tuple[list[Any], ...]:
    """Events and their chain links as the six arrays of an insert (``unnest``)."""
    return ([e.originator_id for e in events], [e.originator_version for e in events], [e.topic for e in events],
            [e.state for e in events], [p for p, _ in links], [h for _, h in links])


def _key_arrays(keys: Sequence[KeyRow]) -> tuple[list[Any], ...]:
    """Data keys' rows as the five arrays of their insert (``unnest``)."""
    return ([k.key_id for k in keys], [k.tenant for k in keys], [k.subject for k in keys], [k.wrapped for k in keys],
            [k.master_key_id for k in keys])


def _idempotency_params(row: IdempotencyRecord) -> tuple[Any, ...]:
    """The key's record as the append's parameters (migration 14's layout: ``schema.idempotency_references``)."""
    return (row.tenant, row.key, row.fingerprint, row.command_type, row.aggregate_id, row.stream_version, row.outcome,
            row.event_count, row.aggregate_type)
