"""The append-only PostgreSQL event store: schema, appends, and the gap-safe notification log.

Built on ``eventsourcing``'s ``PostgresApplicationRecorder`` (its datastore, pool, event
and notification types, per-stream reads, LISTEN subscription), with three changes:

1. **No table lock on append.** The stock recorder takes ``LOCK TABLE ... EXCLUSIVE``
   on every insert so notification ids commit in order; that serialises every writer,
   fsync included. Here writers run in parallel and the *reader* proves gaps instead.
2. **Gap-safe reads.** Notification ids come from a sequence (CACHE 1, so ids grow in
   the order they are drawn), but transactions commit in any order, so a reader can
   see id 12 while id 11 is still uncommitted. ``select_notifications`` returns only
   the contiguous prefix of ids, and passes a gap only once it is proven permanent:

   - every writer assigns itself a transaction id *before* drawing notification ids;
   - if a read at snapshot S1 sees id h but not g < h, then g was drawn before h, and h
     committed before S1, so the writer X of g had its xid before S1 and was either
     aborted or still running at S1;
   - right after S1 the reader draws a fresh xid B in a throw-away transaction (rolled
     back: no commit record to flush). X's xid < B. (A snapshot's own xmax is no such
     bound: it is latestCompletedXid + 1, and a running writer may sit above it.)
   - a later snapshot S2 with xmin(S2) >= B proves every xid below B has ended; if g
     is still absent in S2, X aborted and g will never appear, so the reader passes it.

   Consequence: a follower never skips an event that commits late (the leapfrog
   problem), without serialising writers. The cost, as in Emmett: a very long open
   transaction delays passing a gap (never correctness).
3. **Append-only for real, plus idempotency in the same transaction.** Triggers reject
   UPDATE, DELETE and TRUNCATE on events; the idempotency record is inserted in the
   events' transaction, so both commit or neither does.

Wake-ups: after a successful append the writer sends ``NOTIFY`` outside the event
transaction. (``NOTIFY`` inside a transaction takes a database-wide lock until commit
ends, which would serialise commits again.) Followers also poll, so a lost wake-up only
delays them; so does ``subscribe()`` (``subscription.PollingSubscription``).

Reading with ``topics`` filters before the limit (a page of other events never hides a
matching one behind it) and still stops before any unproven gap below the last match: the
missing event might be one of the wanted topics. Table names are parameters (commitline's
own are ``events``, ``idempotency_keys``, ``snapshots``; the ``eventsourcing`` persistence
module in ``commitline.eventsourcing`` uses one set per application).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent, Subscription
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier
from typing_extensions import Self

from commitline.application.chain import GENESIS, chain
from commitline.application.errors import StoreUnavailable
from commitline.application.ports import IdempotencyRecord, KeyAlreadyRecorded, StreamMoved
from commitline.infrastructure.store import pipelined
from commitline.infrastructure.store.datastore import StoreDatastore
from commitline.infrastructure.store.pipelined import SYNC, Statement
from commitline.infrastructure.store.subscription import PollingSubscription

EVENTS_TABLE = "events"
IDEMPOTENCY_TABLE = "idempotency_keys"
SNAPSHOTS_TABLE = "snapshots"
_MAX_TRACKED_GAPS = 100_000
# Appends whose event states add up to more than this are sent statement by statement instead of in
# one pipeline. psycopg's pipeline stops flushing once its last command is queued and then waits only
# for replies; what the kernel's socket buffers could not take by then is never sent, so the server
# waits for the rest of the message and the client for a reply, forever, with the transaction open.
# Below Linux's initial TCP send buffer (16 KiB, net.ipv4.tcp_wmem) everything is always taken at once.
PIPELINE_MAX_BYTES = 8 * 1024
_NO_STOP = 2**63 - 1
#: A hook run inside an append's transaction, after the writer's xid and before the events (with the
#: connection): e.g. an ``eventsourcing`` tracking record. Its error rolls the whole append back.
InTransaction = Callable[[Any], None]


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


@dataclass(frozen=True)
class PendingAppend:
    """One command's append, waiting to go out in a batch (``append_batch``)."""

    events: Sequence[StoredEvent]
    idempotency: IdempotencyRecord | None
    links: Sequence[tuple[bytes, bytes]]
    trace: Any = None  # the append's span when tracing is on (``infrastructure/tracing.AppendTrace``)

    @property
    def size(self) -> int:
        return sum(len(e.state) for e in self.events)


@dataclass
class CommandRead:
    """What ``read_for_command`` found: the key's record, the snapshot, the events after it or after the
    version the caller knew, and the hash of the last of them (None if it read neither)."""

    idempotency: IdempotencyRecord | None = None
    snapshot: Snapshot | None = None
    events: list[StoredEvent] = field(default_factory=list)
    head_hash: bytes | None = None


class EventRecorder(PostgresApplicationRecorder):
    datastore: StoreDatastore
    #: Seconds between a subscription's polls when no wake-up arrives (it also re-reads after a gap).
    subscription_poll_interval = 0.25

    def __init__(self, datastore: StoreDatastore | PostgresDatastore, *, events_table: str = EVENTS_TABLE,
                 idempotency_table: str = IDEMPOTENCY_TABLE, snapshots_table: str = SNAPSHOTS_TABLE,
                 originator_id_type: str = "uuid"):
        super().__init__(datastore, events_table_name=events_table)
        self._q = _Statements(datastore.schema, events=events_table, idempotency=idempotency_table,
                              snapshots=snapshots_table, originator_id_type=originator_id_type)
        self.sql_create_statements = self._q.create_statements()
        self.channel_name = self._q.channel
        # first missing id of a gap -> an xid drawn just after the gap was first seen
        self._gaps: dict[int, int] = {}
        self._gaps_lock = threading.Lock()
        # Test seam for crash-safety tests: runs inside the append transaction,
        # after the inserts and before COMMIT.
        self.before_commit: Callable[[], None] | None = None
        # Test seam for the batch path: runs between two commands of a batch (given how many are inserted).
        self.between_commands: Callable[[int], None] | None = None
        self._idempotency_table = idempotency_table

    # -- schema -------------------------------------------------------------------

    def create_table(self) -> None:
        with self.datastore.get_connection() as conn:
            conn.execute(SQL("CREATE SCHEMA IF NOT EXISTS {}").format(Identifier(self.datastore.schema)))
            with conn.transaction():
                # Serialise concurrent first starts: CREATE ... IF NOT EXISTS races otherwise.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"commitline-schema-{self.datastore.schema}",))
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
               in_transaction: InTransaction | None = None) -> list[int]:
        """Insert events (and the idempotency record) in one transaction; return their notification ids.

        ``links`` are the events' (prev_hash, event_hash) pairs (``chain.chain``). When not given they are
        computed per stream, each continuing from the stored hash of the event before its first one.
        ``in_transaction`` runs in the same transaction before the inserts (statement by statement)."""
        if links is None:
            links = []
            heads: dict[UUID, tuple[int, bytes]] = {}
            for e in stored_events:
                known = heads.get(e.originator_id)
                prev = known[1] if known and known[0] == e.originator_version - 1 else self.event_hash(
                    e.originator_id, e.originator_version - 1)
                links.append(chain(prev, [e])[0])
                heads[e.originator_id] = (e.originator_version, links[-1][1])
        params = (
            [e.originator_id for e in stored_events],
            [e.originator_version for e in stored_events],
            [e.topic for e in stored_events],
            [e.state for e in stored_events],
            [p for p, _ in links],
            [h for _, h in links],
        )
        size = sum(len(e.state) for e in stored_events)
        one_trip = size <= PIPELINE_MAX_BYTES and in_transaction is None

        def insert(conn: Any) -> list[int]:
            if one_trip:
                return self._insert_in_one_round_trip(conn, params, idempotency)
            return self._insert_in_steps(conn, params, idempotency, in_transaction)

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

    def _refusal(self, error: pg_errors.Error) -> Exception:
        """What an insert's failure means for its command: a twin holds the key, the stream moved, or
        the error itself (deadlock and serialization failures mean another writer took the version)."""
        if isinstance(error, pg_errors.UniqueViolation):
            return self._taken(error.diag.constraint_name or "")
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
            raise StoreUnavailable(f"the schema {self.datastore.schema} has no append function: it lacks "
                                   "migration 6; run commitline migrate") from None

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
        try:
            kind = pg_errors.lookup(sqlstate)
        except KeyError:  # a code psycopg does not know (a custom one raised by a trigger, a newer server's)
            kind = pg_errors.DatabaseError
        return self._refusal(kind(f"{detail} (SQLSTATE {sqlstate})"))

    def _taken(self, constraint: str) -> Exception:
        """A unique violation on ``constraint``: a twin holds the key, or another writer took the version."""
        if constraint.startswith(self._idempotency_table):
            return KeyAlreadyRecorded(constraint)
        return StreamMoved(constraint)

    def _insert_in_one_round_trip(self, conn: Any, params: tuple[Any, ...],
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
            inserted.execute(self._q.insert_events, params, prepare=True)
            if self.before_commit is not None:
                pipeline.sync()
                self.before_commit()
            cur.execute("COMMIT")
            cur.execute(self._q.notify)
            pipeline.sync()
            return [row[0] for row in inserted.fetchall()]

    def _insert_in_steps(self, conn: Any, params: tuple[Any, ...], idempotency: IdempotencyRecord | None,
                         in_transaction: InTransaction | None = None) -> list[int]:
        # The same statements without the pipeline: each one is sent completely before its reply is awaited.
        cur = conn.cursor(row_factory=tuple_row)
        cur.execute("BEGIN")
        cur.execute(self._q.assign_xid)
        if in_transaction is not None:
            in_transaction(conn)
        if idempotency is not None:
            cur.execute(self._q.insert_idempotency, _idempotency_params(idempotency))
        ids = [row[0] for row in cur.execute(self._q.insert_events, params).fetchall()]
        if self.before_commit is not None:
            self.before_commit()
        cur.execute("COMMIT")
        cur.execute(self._q.notify)
        return ids

    # -- per-stream reads ---------------------------------------------------------

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
        steps = [(self._q.read_for_command, (aggregate_id, known_version, tenant, key, use_snapshot)), SYNC]
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
                self._q.select_hash, (aggregate_id, version), prepare=True).fetchone()
        return bytes(row[0]) if row else GENESIS

    def stream_version(self, aggregate_id: UUID) -> int:
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(self._q.stream_head, (aggregate_id,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self._connection() as conn:
            conn.execute(
                self._q.insert_snapshot,
                (snapshot.aggregate_id, snapshot.version, snapshot.aggregate_type, snapshot.state, snapshot.event_hash),
            )

    def find_idempotency(self, tenant: str, key: str) -> IdempotencyRecord | None:
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(
                self._q.select_idempotency, (tenant, key), prepare=True).fetchone()
        if row is None:
            return None
        return IdempotencyRecord(tenant, key, bytes(row[0]), row[1], row[2], row[3], bytes(row[4]))

    # -- the notification log -----------------------------------------------------

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Notifications from ``start`` in id order, ending before any gap not yet proven permanent.

        With ``topics``, up to ``limit`` notifications of those topics (filtered before the limit)."""
        return self.read_notifications(start, limit, stop, topics, inclusive_of_start=inclusive_of_start)[0]

    def read_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> tuple[list[Notification], int | None]:
        """``select_notifications``, and the id of the gap not yet proven permanent that ended the read early
        (None if none did)."""
        first = 1 if start is None else (start if inclusive_of_start else start + 1)
        first = max(first, 1)  # ids start at 1: nothing below can be missing
        if topics:
            return self._select_of_topics(first, limit, stop, list(topics))
        with self._connection() as conn:
            # One statement, one snapshot: the rows and the xmin they are judged by agree.
            if stop is None:
                rows = conn.cursor(row_factory=tuple_row).execute(
                    self._q.select_log, (first, limit), prepare=True).fetchall()
            else:
                rows = conn.cursor(row_factory=tuple_row).execute(
                    self._q.select_log_until, (first, stop, limit), prepare=True).fetchall()
        notifications: list[Notification] = []
        expected, new_gap, blocked = first, None, None
        xmin = int(rows[0][0]) if rows else 0
        with self._gaps_lock:
            for _, nid, originator_id, version, topic, state in rows:
                if nid > expected:
                    if not self._passable(expected, xmin):
                        new_gap = expected if expected not in self._gaps else None
                        blocked = expected
                        break
                    # Proven permanent (aborted ids). The entry stays: xmin only grows, so the
                    # proof holds for every other reader of this recorder too.
                expected = nid + 1
                notifications.append(
                    Notification(id=nid, originator_id=originator_id, originator_version=version, topic=topic,
                                 state=bytes(state))
                )
            self._forget_old_gaps()
        if new_gap is not None:
            self._note_gap(new_gap)
        return notifications, blocked

    def _select_of_topics(self, first: int, limit: int, stop: int | None,
                          topics: list[str]) -> tuple[list[Notification], int | None]:
        """The page of matching rows and, in the same statement (snapshot), the gaps below its last row."""
        with self._connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._q.select_log_of_topics,
                {"first": first, "stop": _NO_STOP if stop is None else stop, "topics": topics, "limit": limit},
                prepare=True).fetchall()
        if not rows:
            return [], None
        cutoff = self.first_unproven_gap([row[2] for row in rows if row[1]], int(rows[0][0]))
        return [
            Notification(id=nid, originator_id=originator_id, originator_version=version, topic=topic,
                         state=bytes(state))
            for _, is_gap, nid, originator_id, version, topic, state in sorted(rows, key=lambda r: r[2])
            if not is_gap and (cutoff is None or nid < cutoff)
        ], cutoff

    def first_unproven_gap(self, gaps: Sequence[int], xmin: int) -> int | None:
        """For a filtered read (by topics here, by bucket in ``followers/buckets.py``): the first of ``gaps`` (first missing
        ids below the read's last row, read in the same snapshot, whose xmin is ``xmin``) not yet proven
        permanent, which the read must stop before; None when every one may be passed. Shares this
        recorder's gap bookkeeping, so a gap proven for one reader is passed by all."""
        cutoff, new_gap = None, None
        with self._gaps_lock:
            for gap in sorted(gaps):
                if not self._passable(gap, xmin):
                    cutoff, new_gap = gap, (gap if gap not in self._gaps else None)
                    break
            self._forget_old_gaps()
        if new_gap is not None:
            self._note_gap(new_gap)
        return cutoff

    def _passable(self, gap: int, xmin: int) -> bool:
        """Is the gap starting at ``gap`` proven permanent by a snapshot with this xmin? (Lock held.)"""
        bound = self._gaps.get(gap)
        return bound is not None and xmin >= bound

    def _note_gap(self, gap: int) -> None:
        bound = self._fresh_xid()
        with self._gaps_lock:
            self._gaps.setdefault(gap, bound)

    def _forget_old_gaps(self) -> None:
        if len(self._gaps) > _MAX_TRACKED_GAPS:  # forget the oldest; a re-sighting only costs a poll
            for gap in sorted(self._gaps)[: len(self._gaps) - _MAX_TRACKED_GAPS]:
                del self._gaps[gap]

    def subscribe(self, gt: int | None = None, topics: Sequence[str] = ()) -> Subscription[Self]:  # type: ignore[override]
        """Notifications after ``gt`` as they commit: woken by NOTIFY, and polling every
        ``subscription_poll_interval`` s, so a gap left by an aborted write is passed without another write."""
        return PollingSubscription(self, gt=gt, topics=topics, poll_interval=self.subscription_poll_interval)

    def gaps_seen(self) -> set[int]:
        """First ids of the gaps readers of this recorder have met (open or proven aborted): diagnostics."""
        with self._gaps_lock:
            return set(self._gaps)

    def _fresh_xid(self) -> int:
        with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            with conn.transaction(force_rollback=True):
                cur.execute(self._q.assign_xid)
                return int(cur.fetchone()[0])  # type: ignore[index]

    def max_notification_id(self) -> int | None:
        with self._connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(self._q.max_notification_id).fetchone()
        return row[0] if row else None


def store_schema_statements(schema: str) -> list[Composed]:
    """The DDL of the event store's tables, for the schema migrations."""
    return _Statements(schema).create_statements()


def store_append_function_statements(schema: str) -> list[Composed]:
    """The DDL of the store's append function (migration 6), used by ``append_batch``."""
    return _Statements(schema).append_function_statements()


def _append_params(pending: PendingAppend, one: bool) -> tuple[Any, ...]:
    key = _idempotency_params(pending.idempotency) if pending.idempotency is not None else (None,) * 7
    if one:
        e, (prev, this) = pending.events[0], pending.links[0]
        return (*key, e.originator_id, e.originator_version, e.topic, e.state, prev, this)
    events = pending.events
    return (
        *key,
        [e.originator_id for e in events], [e.originator_version for e in events], [e.topic for e in events],
        [e.state for e in events], [p for p, _ in pending.links], [h for _, h in pending.links],
    )


def _idempotency_params(row: IdempotencyRecord) -> tuple[Any, ...]:
    return (row.tenant, row.key, row.fingerprint, row.command_type, row.aggregate_id, row.stream_version, row.outcome)


class _Statements:
    """Every SQL statement of the event store, qualified with one schema and its table names."""

    def __init__(self, schema: str, *, events: str = EVENTS_TABLE, idempotency: str = IDEMPOTENCY_TABLE,
                 snapshots: str = SNAPSHOTS_TABLE, originator_id_type: str = "uuid"):
        if originator_id_type not in ("uuid", "text"):
            raise ValueError(f"originator_id_type must be 'uuid' or 'text', not {originator_id_type!r}")
        self.channel = f"{schema}_{events}"

        def q(text: str) -> Composed:
            return SQL(text).format(
                schema=Identifier(schema),
                events=Identifier(schema, events),
                # commitline's own spelling unquoted, so migration step 1's DDL stays byte for byte as released
                events_id_idx=SQL("events_notification_id_idx") if events == EVENTS_TABLE
                else Identifier(f"{events}_notification_id_idx"),
                idem=Identifier(schema, idempotency),
                snaps=Identifier(schema, snapshots),
                reject=Identifier(schema, "reject_event_change"),
                channel=Identifier(self.channel),
                id_type=SQL(originator_id_type),
                append=Identifier(schema, f"append_to_{events}"),
                append_one=Identifier(schema, f"append_one_to_{events}"),
            )

        self._q = q
        self.assign_xid = q("SELECT pg_current_xact_id()::text")
        self.insert_events = q(
            "INSERT INTO {events} (originator_id, originator_version, topic, state, prev_hash, event_hash) "
            "SELECT * FROM unnest(%s::{id_type}[], %s::int8[], %s::text[], %s::bytea[], %s::bytea[], %s::bytea[]) "
            "RETURNING notification_id"
        )
        self.insert_idempotency = q(
            "INSERT INTO {idem} (tenant, key, fingerprint, command_type, aggregate_id, stream_version, outcome) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)"
        )
        self.select_hash = q("SELECT event_hash FROM {events} WHERE originator_id = %s AND originator_version = %s")
        self.select_idempotency = q(
            "SELECT fingerprint, command_type, aggregate_id, stream_version, outcome FROM {idem} "
            "WHERE tenant = %s AND key = %s"
        )
        self.notify = q("NOTIFY {channel}")
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
        log_columns = ("SELECT pg_snapshot_xmin(pg_current_snapshot())::text, notification_id, originator_id, "
                       "originator_version, topic, state FROM {events} ")
        self.select_log = q(log_columns + "WHERE notification_id >= %s ORDER BY notification_id LIMIT %s")
        self.select_log_until = q(
            log_columns + "WHERE notification_id >= %s AND notification_id <= %s ORDER BY notification_id LIMIT %s")
        # The first rows of the wanted topics, and every gap in the ids up to the last of them, in one snapshot.
        self.select_log_of_topics = q(
            "WITH page AS (SELECT notification_id, originator_id, originator_version, topic, state FROM {events} "
            "WHERE notification_id >= %(first)s AND notification_id <= %(stop)s AND topic = ANY(%(topics)s::text[]) "
            "ORDER BY notification_id LIMIT %(limit)s), "
            "span AS (SELECT notification_id, lag(notification_id, 1, %(first)s::int8 - 1) "
            "OVER (ORDER BY notification_id) AS prev FROM {events} "
            "WHERE notification_id >= %(first)s AND notification_id <= (SELECT max(notification_id) FROM page)) "
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text, false, notification_id, originator_id, "
            "originator_version, topic, state FROM page UNION ALL "
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text, true, prev + 1, NULL, NULL, NULL, NULL "
            "FROM span WHERE notification_id > prev + 1"
        )
        self.max_notification_id = q("SELECT max(notification_id) FROM {events}")
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
        self.notify_bytes = self.notify.as_bytes(None)
        key_types = ("text", "text", "bytea", "text", "uuid", "int8", "bytea")
        call = "SELECT ids, refused, detail FROM {%s}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        self.append_command = Statement.of(
            q(call % "append"), (*key_types, "uuid[]", "int8[]", "text[]", "bytea[]", "bytea[]", "bytea[]"))
        self.append_one = Statement.of(  # the common case, a command with one event: no arrays to build
            q(call % "append_one"), (*key_types, "uuid", "int8", "text", "bytea", "bytea", "bytea"))

    def append_function_statements(self) -> list[Composed]:
        """One command's append as one statement that never fails: the key's record, then its events (their
        notification ids in ``ids``). On any error its exception block (a subtransaction) undoes both
        and returns the error's SQLSTATE in ``refused`` and, in ``detail``, the constraint of a unique
        violation or else the message. Two variants: events as arrays, or one event as scalars."""
        def function(name: str, event_params: str, insert: str) -> Composed:
            return self._q(
                "CREATE OR REPLACE FUNCTION " + name + "("
                " p_tenant text, p_key text, p_fingerprint bytea, p_command_type text, p_aggregate_id uuid,"
                " p_stream_version int8, p_outcome bytea, " + event_params + ","
                " OUT ids int8[], OUT refused text, OUT detail text) LANGUAGE plpgsql AS $$"
                " DECLARE one int8; BEGIN"
                " PERFORM pg_current_xact_id();"  # the transaction's xid before any notification id: the gap proof
                " IF p_key IS NOT NULL THEN"
                "  INSERT INTO {idem} (tenant, key, fingerprint, command_type, aggregate_id, stream_version, outcome)"
                "  VALUES (p_tenant, p_key, p_fingerprint, p_command_type, p_aggregate_id, p_stream_version,"
                "  p_outcome);"
                " END IF; " + insert +
                " EXCEPTION WHEN OTHERS THEN"
                "  GET STACKED DIAGNOSTICS refused = RETURNED_SQLSTATE, detail = CONSTRAINT_NAME;"
                "  IF refused <> '23505' THEN detail := SQLERRM; END IF;"
                "  ids := NULL;"
                " END $$")

        columns = "INSERT INTO {events} (originator_id, originator_version, topic, state, prev_hash, event_hash) "
        return [
            function("{append}", "p_ids {id_type}[], p_versions int8[], p_topics text[], p_states bytea[], "
                     "p_prevs bytea[], p_hashes bytea[]",
                     "WITH inserted AS (" + columns + "SELECT * FROM unnest(p_ids, p_versions, p_topics, p_states, "
                     "p_prevs, p_hashes) RETURNING notification_id) "
                     "SELECT array_agg(notification_id ORDER BY notification_id) INTO ids FROM inserted;"),
            function("{append_one}", "p_id {id_type}, p_version int8, p_topic text, p_state bytea, p_prev bytea, "
                     "p_hash bytea",
                     columns + "VALUES (p_id, p_version, p_topic, p_state, p_prev, p_hash) "
                     "RETURNING notification_id INTO one; ids := ARRAY[one];"),
        ]

    def append_only_statements(self) -> list[Composed]:
        """The trigger function and the triggers that reject UPDATE, DELETE and TRUNCATE on the events table."""
        q = self._q
        return [
            q(
                "CREATE OR REPLACE FUNCTION {reject}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "RAISE EXCEPTION 'events are append-only: % on %.% rejected', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME "
                "USING ERRCODE = 'restrict_violation'; END $$"
            ),
            q(
                "CREATE OR REPLACE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON {events} "
                "FOR EACH ROW EXECUTE FUNCTION {reject}()"
            ),
            q(
                "CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON {events} "
                "FOR EACH STATEMENT EXECUTE FUNCTION {reject}()"
            ),
        ]

    def create_statements(self) -> list[Composed]:
        q = self._q
        return [
            q(
                "CREATE TABLE IF NOT EXISTS {events} ("
                " notification_id bigint GENERATED ALWAYS AS IDENTITY (CACHE 1),"
                " originator_id uuid NOT NULL,"
                " originator_version bigint NOT NULL CHECK (originator_version > 0),"
                " topic text NOT NULL,"
                " state bytea NOT NULL,"
                " txid xid8 NOT NULL DEFAULT pg_current_xact_id(),"
                " prev_hash bytea NOT NULL,"
                " event_hash bytea NOT NULL,"
                " PRIMARY KEY (originator_id, originator_version))"
            ),
            q("CREATE UNIQUE INDEX IF NOT EXISTS {events_id_idx} ON {events} (notification_id)"),
            *self.append_only_statements(),
            q(
                "CREATE TABLE IF NOT EXISTS {idem} ("
                " tenant text NOT NULL,"
                " key text NOT NULL,"
                " fingerprint bytea NOT NULL,"
                " command_type text NOT NULL,"
                " aggregate_id uuid NOT NULL,"
                " stream_version bigint NOT NULL,"
                " outcome bytea NOT NULL,"
                " recorded_at timestamptz NOT NULL DEFAULT now(),"
                " PRIMARY KEY (tenant, key))"
            ),
            q(
                "CREATE TABLE IF NOT EXISTS {snaps} ("
                " aggregate_id uuid NOT NULL,"
                " version bigint NOT NULL,"
                " aggregate_type text NOT NULL,"
                " state bytea NOT NULL,"
                " event_hash bytea NOT NULL,"
                " taken_at timestamptz NOT NULL DEFAULT now(),"
                " PRIMARY KEY (aggregate_id, version))"
            ),
        ]
