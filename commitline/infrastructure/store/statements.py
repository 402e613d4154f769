"""The recorder's statements on the event tables, for one set of names (``schema.EventTables``): the appends
(one command's insert, the group commit's calls of the append functions), the wake-up, the per-stream reads,
snapshots and idempotency lookups. (The notification log's reads are ``log.py``'s.)

One command's insert on commitline's own tables (``insert_proven``) proves each event's predecessor
(``EventTables.continues``) in the same statement, all events or none, and inserts the key's record in it too,
only if the events are: a refused append returns no notification ids and writes nothing. The key goes in first
(the events' WHERE reads its CTE), so a twin's key is waited on before any version is. An ``eventsourcing``
application's tables keep the library's contract: unique versions, nothing proven (``insert_events``).

A command whose events are sealed under data keys not stored yet (a new data subject's: ``personal/cipher.py``)
inserts those keys in the same statement, or the same append function's call (``*_keyed``), after the key's
record and only if the events are: a subject that got its key first refuses the whole append (unique
violation on ``data_keys``), which writes nothing.
"""

from __future__ import annotations

from psycopg.sql import Composed

from commitline.infrastructure.store.pipelined import Statement
from commitline.infrastructure.store.schema import EVENT_COLUMNS, EventTables


#: A stream's events after a version the statement itself reads (its latest snapshot's), written as a range up to
#: int8's largest: the planner then takes the tail for a small part of the stream (a range of unknown bounds) rather
#: than a third of it (one unknown bound), so a stream that is most of its table is still read through the primary
#: key, not by a sequential scan of the table (measured: 0.03 against 0.45-1.2 ms for a 10,000-event stream).
_TAIL = "BETWEEN {} + 1 AND 9223372036854775807"
#: A snapshot (``sn``) is used only while the log holds the event it was taken at, with the same chain hash: one
#: of a history the store no longer has (an asynchronous failover, a restore) is passed over.
_HELD = ("EXISTS (SELECT 1 FROM {{events}} e WHERE e.originator_id = {} AND e.originator_version = sn.version "
         "AND e.event_hash = sn.event_hash)")


class Statements:
    def __init__(self, tables: EventTables):
        q = tables.sql
        # -- writes
        self.assign_xid = q("SELECT pg_current_xact_id()::text")
        self.insert_events = q(
            "INSERT INTO {events} (originator_id, originator_version, topic, state, prev_hash, event_hash) "
            "SELECT * FROM unnest(%s::{id_type}[], %s::int8[], %s::text[], %s::bytea[], %s::bytea[], %s::bytea[]) "
            "RETURNING notification_id"
        )
        # The events of one command and its key's record (NULLs for none), in one statement: both inserted
        # only if every event continues its stream; RETURNING says how many were (all, or none).
        def proven(keyed: bool) -> Composed:
            # ``keyed``: five arrays more, the rows of the data keys the events are sealed under that are not
            # stored yet, inserted after the key's record (whose CTE their WHERE reads) and only if the events
            # are; plainly: a subject that has a key already raises unique_violation on data_keys.
            new_keys = ("new_keys AS (INSERT INTO {keys} (key_id, tenant, subject, wrapped, master_key_id) "
                        "SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::bytea[], %s::text[]) "
                        "WHERE (SELECT proven FROM proof) AND (SELECT count(*) FROM key) >= 0 RETURNING 1) ")
            return q(
                "WITH batch AS (SELECT * FROM unnest(%s::{id_type}[], %s::int8[], %s::text[], %s::bytea[], "
                "%s::bytea[], %s::bytea[]) AS n(" + EVENT_COLUMNS + ")), "
                "proof AS (SELECT bool_and(" + tables.continues("n", "batch") + ") AS proven FROM batch n), "
                "key AS (INSERT INTO {idem} "
                "(tenant, key, fingerprint, command_type, aggregate_id, stream_version, outcome, event_count, "
                "aggregate_type) "
                "SELECT * FROM (VALUES (%s::text, %s::text, %s::bytea, %s::text, %s::uuid, %s::int8, %s::bytea, "
                "%s::int4, %s::text)) "
                "AS k(tenant, key, fingerprint, command_type, aggregate_id, stream_version, outcome, event_count, "
                "aggregate_type) "
                "WHERE k.key IS NOT NULL AND (SELECT proven FROM proof) RETURNING 1)" + (", " + new_keys if keyed
                                                                                      else " ") +
                "INSERT INTO {events} (" + EVENT_COLUMNS + ") SELECT * FROM batch "
                "WHERE (SELECT proven FROM proof) AND (SELECT count(*) FROM key) >= 0" +
                (" AND (SELECT count(*) FROM new_keys) >= 0" if keyed else "") + " RETURNING notification_id"
            )

        self.insert_proven = None if tables.eventsourcing else proven(keyed=False)
        self.insert_proven_keyed = None if tables.eventsourcing else proven(keyed=True)
        self.insert_idempotency = q(
            "INSERT INTO {idem} (tenant, key, fingerprint, command_type, aggregate_id, stream_version, outcome, "
            "event_count, aggregate_type) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        self.notify = q("NOTIFY {channel}")
        self.notify_bytes = self.notify.as_bytes(None)
        # The key's record as migration 14's append functions take it (the overloads with the event count and the
        # aggregate type after the outcome).
        key_types = ("text", "text", "bytea", "text", "uuid", "int8", "bytea", "int4", "text")
        call = "SELECT ids, refused, detail FROM {%s}(" + ", ".join(f"${n}" for n in range(1, 16)) + ")"
        self.append_command = Statement.of(
            q(call % "append"), (*key_types, "uuid[]", "int8[]", "text[]", "bytea[]", "bytea[]", "bytea[]"))
        self.append_one = Statement.of(  # the common case, a command with one event: no arrays to build
            q(call % "append_one"), (*key_types, "uuid", "int8", "text", "bytea", "bytea", "bytea"))
        # The same with the rows of the data keys of the command's new subjects (migration 13).
        keyed = "SELECT ids, refused, detail FROM {%s}(" + ", ".join(f"${n}" for n in range(1, 21)) + ")"
        data_key_types = ("uuid[]", "text[]", "text[]", "bytea[]", "text[]")
        self.append_keyed = Statement.of(q(keyed % "append_keyed"), (
            *key_types, *data_key_types, "uuid[]", "int8[]", "text[]", "bytea[]", "bytea[]", "bytea[]"))
        self.append_one_keyed = Statement.of(q(keyed % "append_one_keyed"), (
            *key_types, *data_key_types, "uuid", "int8", "text", "bytea", "bytea", "bytea"))
        # -- per-stream reads
        self.select_hash = q("SELECT event_hash FROM {events} WHERE originator_id = %s AND originator_version = %s")
        # The key's record and, in the same statement, the events it refers to (migration 14): one row per event
        # (one row with NULL event columns for a record that refers to none, or holds its outcome).
        self.select_idempotency = q(
            "WITH r AS (SELECT fingerprint, command_type, aggregate_id, stream_version, outcome, event_count, "
            "aggregate_type FROM {idem} WHERE tenant = %s AND key = %s) "
            "SELECT r.*, e.originator_version, e.topic, e.state FROM r LEFT JOIN {events} e "
            "ON r.outcome IS NULL AND e.originator_id = r.aggregate_id "
            "AND e.originator_version > r.stream_version - coalesce(r.event_count, 0) "
            "AND e.originator_version <= r.stream_version ORDER BY e.originator_version"
        )
        # The events a key's record refers to (migration 14): its command's, a version range of one stream.
        self.command_events = q(
            "SELECT originator_version, topic, state FROM {events} WHERE originator_id = %s "
            "AND originator_version > %s AND originator_version <= %s ORDER BY originator_version"
        )
        self.stream_after_snapshot = q(
            "WITH s AS (SELECT version, aggregate_type, state, event_hash FROM {snaps} sn WHERE aggregate_id = %(id)s "
            "AND " + _HELD.format("%(id)s") + " ORDER BY version DESC LIMIT 1) "
            "SELECT true, version, aggregate_type, state, event_hash, (SELECT state FROM {events} "
            "WHERE originator_id = %(id)s AND originator_version = 1) FROM s UNION ALL "
            "SELECT false, originator_version, topic, state, event_hash, NULL FROM {events} "
            "WHERE originator_id = %(id)s AND originator_version " + _TAIL.format("coalesce((SELECT version FROM s), 0)") +
            " ORDER BY 1 DESC, 2"
        )
        self.stream_from_start = q(
            "SELECT false, originator_version, topic, state, event_hash, NULL FROM {events} "
            "WHERE originator_id = %(id)s ORDER BY originator_version"
        )
        self.stream_head = q("SELECT max(originator_version) FROM {events} WHERE originator_id = %s")
        # New snapshots replace their streams' older ones (a load reads only the latest). Only those whose
        # event the log holds, with their hash, are new: one of a lost history (queued before a failover) is
        # neither stored nor a reason to delete. A row another transaction is deleting too is skipped, never
        # waited for: two writers cannot deadlock on it, and what one of them leaves goes with its stream's next
        # snapshot.
        self.insert_snapshots = Statement.of(q(
            "WITH new AS (SELECT n.* FROM unnest($1, $2, $3, $4, $5) AS n(aggregate_id, version, aggregate_type, "
            "state, event_hash) JOIN {events} e ON e.originator_id = n.aggregate_id "
            "AND e.originator_version = n.version AND e.event_hash = n.event_hash), "
            "inserted AS (INSERT INTO {snaps} (aggregate_id, version, aggregate_type, state, event_hash) "
            "SELECT * FROM new ON CONFLICT DO NOTHING), "
            "older AS (SELECT s.ctid FROM {snaps} s JOIN new ON s.aggregate_id = new.aggregate_id "
            "AND s.version < new.version FOR UPDATE OF s SKIP LOCKED) "
            "DELETE FROM {snaps} WHERE ctid IN (SELECT ctid FROM older)"
        ), ("uuid[]", "int8[]", "text[]", "bytea[]", "bytea[]"))
        # The command hot path (``pipelined``): one read per command, appends batched in one transaction.
        # Read: the key's record (kind 2), the latest snapshot if asked for (kind 1, with the first event's
        # state, which names the owner), and the events after both it and the version the caller knows (kind 0).
        self.read_for_command = Statement.of(q(
            "WITH s AS (SELECT version, aggregate_type, state, event_hash FROM {snaps} sn "
            "WHERE $5 AND aggregate_id = $1 AND version > $2 AND " + _HELD.format("$1") +
            " ORDER BY version DESC LIMIT 1) "
            "SELECT 2, stream_version, command_type, outcome, fingerprint, convert_to(aggregate_type, 'UTF8'), "
            "aggregate_id, event_count FROM {idem} WHERE tenant = $3 AND key = $4 UNION ALL "
            "SELECT 1, version, aggregate_type, state, event_hash, (SELECT state FROM {events} "
            "WHERE originator_id = $1 AND originator_version = 1), NULL::uuid, NULL::int4 FROM s UNION ALL "
            "SELECT 0, originator_version, topic, state, event_hash, NULL::bytea, NULL::uuid, NULL::int4 FROM {events} "
            "WHERE originator_id = $1 AND originator_version " +
            _TAIL.format("greatest($2, coalesce((SELECT version FROM s), 0))") +
            " ORDER BY 1 DESC, 2"), ("uuid", "int8", "text", "text", "bool"))
