"""The event store's tables, defined once, for one schema and one set of names.

``EventTables`` holds the names (schema, events, idempotency and snapshots tables, the originator id type)
and writes every statement that creates them: the events table (identity notification ids drawn in order
(CACHE 1), the writer's xid, the hash chain), its notification-id index, the append-only triggers, the
idempotency and snapshots tables, and the append functions of the group commit; and the condition under which
an append stores an event (``continues``: it proves its predecessor). Statements on the tables
(``sql``) are written with the same names by their users (``recorder.py``, ``log.py``).

Two users, one definition, so their events tables cannot differ:

- commitline's store: migration steps 1, 6, 11, 13 and 14 (``store_schema_statements``,
  ``store_append_function_statements``, ``store_proven_append_statements``, ``store_keyed_append_statements``,
  ``store_referenced_record_statements``), and ``EventRecorder.create_table`` (the tables of steps 1 and 14);
- the ``eventsourcing`` module (``commitline.eventsourcing``), one set of tables per application
  (``EventTables.of_application``). Its tables differ only where eventsourcing requires it: originator ids
  of its ``ORIGINATOR_ID_TYPE`` (uuid or text), versions from 0 (the library's aggregates may start there;
  commitline's streams start at 1, a CHECK), an idempotency table of keys alone (its callers name a key, not
  a command with an outcome), and snapshots in the library's aggregate layout (what its aggregate recorder
  reads). Its appends do not prove their predecessor (``continues``): the library's contract is unique versions,
  and its streams may begin at any version, so a first event cannot be told from one whose predecessor is gone.

``lock_schema`` serialises all of this DDL per schema (one advisory key, shared with the migrations):
concurrent ``CREATE ... IF NOT EXISTS`` and ``CREATE OR REPLACE`` race otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from psycopg.sql import SQL, Composed, Identifier

from commitline.application.chain import GENESIS

EVENTS_TABLE = "events"
DATA_KEYS_TABLE = "data_keys"  # personal/keys.py's: the new subjects' keys a keyed append inserts
IDEMPOTENCY_TABLE = "idempotency_keys"
SNAPSHOTS_TABLE = "snapshots"
ID_TYPES = ("uuid", "text")
EVENT_COLUMNS = "originator_id, originator_version, topic, state, prev_hash, event_hash"  # as an append gives them
GENESIS_SQL = "'\\x" + GENESIS.hex() + "'::bytea"


def lock_key(schema: str) -> str:
    """The advisory lock key of a schema's DDL (migrations hold it for a session, table creation for a transaction)."""
    return f"commitline-schema-{schema}"


def lock_schema(conn: Any, schema: str) -> None:
    """In the caller's transaction (a connection or a cursor): take the schema's DDL lock, create the schema."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_key(schema),))
    conn.execute(SQL("CREATE SCHEMA IF NOT EXISTS {}").format(Identifier(schema)))


@dataclass(frozen=True)
class EventTables:
    """The event store's tables in one schema: their names, and every statement creating them."""

    schema: str
    events: str = EVENTS_TABLE
    idempotency: str = IDEMPOTENCY_TABLE
    snapshots: str = SNAPSHOTS_TABLE
    id_type: str = "uuid"  # of originator ids
    #: eventsourcing's layouts (module docstring): versions from 0, keys alone, the library's snapshots
    eventsourcing: bool = False

    def __post_init__(self) -> None:
        if self.id_type not in ID_TYPES:
            raise ValueError(f"originator_id_type must be 'uuid' or 'text', not {self.id_type!r}")

    @classmethod
    def of_application(cls, schema: str, events: str, id_type: str) -> EventTables:
        """The tables of an ``eventsourcing`` application whose events table is ``events`` (its snapshots table
        is its aggregate recorder's: ``EventTables(schema, snapshots=..., eventsourcing=True)``)."""
        return cls(schema, events, f"{events}_idempotency", id_type=id_type, eventsourcing=True)

    @property
    def channel(self) -> str:
        """The NOTIFY channel of the events table's wake-ups."""
        return f"{self.schema}_{self.events}"

    def sql(self, text: str, **more: Any) -> Composed:
        """``text`` with the names filled in: ``{events}``, ``{idem}``, ``{snaps}``, ``{channel}``, ``{id_type}``,
        ``{append}``, ``{append_one}`` (the append functions), ``{reject}`` (the trigger function); and ``more``."""
        return SQL(text).format(**self._names, **more)

    @cached_property
    def _names(self) -> dict[str, Any]:
        schema = self.schema
        return {
            "events": Identifier(schema, self.events),
            # commitline's own spelling unquoted, so migration step 1's DDL stays byte for byte as released
            "events_id_idx": SQL("events_notification_id_idx") if self.events == EVENTS_TABLE
            else Identifier(f"{self.events}_notification_id_idx"),
            "idem": Identifier(schema, self.idempotency),
            "idem_recorded_idx": Identifier(f"{self.idempotency}_recorded_at_idx"),
            "snaps": Identifier(schema, self.snapshots),
            "reject": Identifier(schema, "reject_event_change"),
            "channel": Identifier(self.channel),
            "id_type": SQL(self.id_type),
            "append": Identifier(schema, f"append_to_{self.events}"),
            "append_one": Identifier(schema, f"append_one_to_{self.events}"),
            "append_keyed": Identifier(schema, f"append_keyed_to_{self.events}"),
            "append_one_keyed": Identifier(schema, f"append_one_keyed_to_{self.events}"),
            "keys": Identifier(schema, DATA_KEYS_TABLE),
        }

    # -- the tables ---------------------------------------------------------------

    def _stream_columns(self) -> str:
        """The columns every event and eventsourcing snapshot has, the first of their primary key."""
        check = "" if self.eventsourcing else " CHECK (originator_version > 0)"
        return (" originator_id {id_type} NOT NULL,"
                " originator_version bigint NOT NULL" + check + ","
                " topic text NOT NULL,"
                " state bytea NOT NULL,")

    def events_table(self) -> list[Composed]:
        """The events table, its notification-id index and its append-only triggers."""
        return [
            self.sql(
                "CREATE TABLE IF NOT EXISTS {events} ("
                " notification_id bigint GENERATED ALWAYS AS IDENTITY (CACHE 1)," + self._stream_columns() +
                " txid xid8 NOT NULL DEFAULT pg_current_xact_id(),"
                " prev_hash bytea NOT NULL,"
                " event_hash bytea NOT NULL,"
                " PRIMARY KEY (originator_id, originator_version))"
            ),
            self.sql("CREATE UNIQUE INDEX IF NOT EXISTS {events_id_idx} ON {events} (notification_id)"),
            *self.append_only(),
        ]

    def append_only(self) -> list[Composed]:
        """The trigger function and the triggers that reject UPDATE, DELETE and TRUNCATE on the events table."""
        return [
            self.sql(
                "CREATE OR REPLACE FUNCTION {reject}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "RAISE EXCEPTION 'events are append-only: % on %.% rejected', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME "
                "USING ERRCODE = 'restrict_violation'; END $$"
            ),
            self.sql(
                "CREATE OR REPLACE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON {events} "
                "FOR EACH ROW EXECUTE FUNCTION {reject}()"
            ),
            self.sql(
                "CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON {events} "
                "FOR EACH STATEMENT EXECUTE FUNCTION {reject}()"
            ),
        ]

    def idempotency_table(self) -> Composed:
        if self.eventsourcing:
            return self.sql("CREATE TABLE IF NOT EXISTS {idem} (key text PRIMARY KEY, "
                            "recorded_at timestamptz NOT NULL DEFAULT now())")
        return self.sql(
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
        )

    def idempotency_references(self) -> list[Composed]:
        """Migration 14: a key's record refers to its command's events instead of holding its outcome (commitline's
        layout only). ``outcome`` becomes nullable (records from before keep theirs, and are replayed from it);
        ``event_count``: how many events the command appended, the last of them at ``stream_version`` (so they are
        the stream's versions ``stream_version - event_count + 1`` to ``stream_version``); ``aggregate_type``: only
        for a command with no events (else the events' own classes name it). A BRIN index on ``recorded_at``, the
        retention job's filter: records are inserted in ``recorded_at`` order, so a few pages index millions."""
        return [
            self.sql("ALTER TABLE {idem} ALTER COLUMN outcome DROP NOT NULL"),
            self.sql("ALTER TABLE {idem} ADD COLUMN IF NOT EXISTS event_count int4"),
            self.sql("ALTER TABLE {idem} ADD COLUMN IF NOT EXISTS aggregate_type text"),
            self.sql("CREATE INDEX IF NOT EXISTS {idem_recorded_idx} ON {idem} USING brin (recorded_at)"),
        ]

    def snapshots_table(self) -> Composed:
        if self.eventsourcing:
            return self.sql("CREATE TABLE IF NOT EXISTS {snaps} (" + self._stream_columns() +
                            " PRIMARY KEY (originator_id, originator_version))")
        return self.sql(
            "CREATE TABLE IF NOT EXISTS {snaps} ("
            " aggregate_id uuid NOT NULL,"
            " version bigint NOT NULL,"
            " aggregate_type text NOT NULL,"
            " state bytea NOT NULL,"
            " event_hash bytea NOT NULL,"
            " taken_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (aggregate_id, version))"
        )

    def event_statements(self) -> list[Composed]:
        """What an application recorder creates: the events table (with index and triggers) and the idempotency table."""
        return [*self.events_table(), self.idempotency_table()]

    def create_statements(self) -> list[Composed]:
        """Every table: ``event_statements`` and the snapshots table."""
        return [*self.event_statements(), self.snapshots_table()]

    def continues(self, row: str, batch: str | None = None) -> str:
        """SQL (with ``{events}`` to fill in) true when the event ``row`` (an alias with the events' columns)
        proves its predecessor: at version 1, prev_hash GENESIS and no event of its stream stored; above,
        the version before it stored with the hash it chains from, or among ``batch`` (the events inserted with
        it, a relation with the same columns). commitline's streams only: they start at version 1 (a version
        below is left to the table's CHECK, whose violation is an error, not a refusal)."""
        stored = ("EXISTS (SELECT FROM {events} e WHERE e.originator_id = " + row + ".originator_id AND "
                  "e.originator_version = " + row + ".originator_version - 1 AND e.event_hash = " + row + ".prev_hash)")
        # IN, not a correlated EXISTS: one hash of the batch, not a scan of it per event (a long append stays linear)
        in_batch = "" if batch is None else (
            " OR (" + row + ".originator_id, " + row + ".originator_version - 1, " + row + ".prev_hash) IN "
            "(SELECT originator_id, originator_version, event_hash FROM " + batch + ")")
        return ("CASE WHEN " + row + ".originator_version = 1 THEN " + row + ".prev_hash = " + GENESIS_SQL +
                " AND NOT EXISTS (SELECT FROM {events} e WHERE e.originator_id = " + row + ".originator_id)"
                " WHEN " + row + ".originator_version > 1 THEN " + stored + in_batch +
                " ELSE true END")

    def append_functions(self, proven: bool = True, keyed: bool = False, referenced: bool = False) -> list[Composed]:
        """One command's append as one statement that never fails: the key's record, then its events (their
        notification ids in ``ids``). On any error its exception block (a subtransaction) undoes both
        and returns the error's SQLSTATE in ``refused`` and, in ``detail``, the constraint of a unique
        violation or else the message. Two variants: events as arrays, or one event as scalars.

        ``proven`` (migration 11; without it, migration 6 as released): an event is inserted only where it
        ``continues`` its stream; when fewer are inserted than given, the append is refused with
        ``foreign_key_violation`` (constraint ``<events>_predecessor``): the event references a predecessor
        that is not stored.

        ``keyed`` (migration 13): the functions ``append_keyed_to_<events>`` and ``append_one_keyed_to_<events>``,
        which take five more arrays after the key's record, the rows of the data keys the events are sealed
        under that are not stored yet (``personal/cipher.NewKeys``), and insert them after the key's record,
        plainly: a subject that has a key already refuses the append (``unique_violation`` on ``data_keys``).

        ``referenced`` (migration 14): the key's record takes two more parameters after ``p_outcome`` (NULL for a
        new record), ``p_event_count`` and ``p_aggregate_type`` (``idempotency_references``); the functions keep
        their names, overloaded by the longer parameter list, so a process from before still calls its own."""
        keys_params = (" p_key_ids uuid[], p_key_tenants text[], p_key_subjects text[], p_key_wrapped bytea[],"
                       " p_key_masters text[],") if keyed else ""
        keys_insert = ("INSERT INTO {keys} (key_id, tenant, subject, wrapped, master_key_id) SELECT * FROM "
                       "unnest(p_key_ids, p_key_tenants, p_key_subjects, p_key_wrapped, p_key_masters); ") \
            if keyed else ""

        record_params = " p_event_count int4, p_aggregate_type text," if referenced else ""
        record_columns = ", event_count, aggregate_type" if referenced else ""
        record_values = ", p_event_count, p_aggregate_type" if referenced else ""

        def function(name: str, event_params: str, insert: str) -> Composed:
            return self.sql(
                "CREATE OR REPLACE FUNCTION " + name + "("
                " p_tenant text, p_key text, p_fingerprint bytea, p_command_type text, p_aggregate_id uuid,"
                " p_stream_version int8, p_outcome bytea," + record_params + keys_params + " " + event_params + ","
                " OUT ids int8[], OUT refused text, OUT detail text) LANGUAGE plpgsql AS $$"
                " DECLARE one int8; BEGIN"
                " PERFORM pg_current_xact_id();"  # the transaction's xid before any notification id: the gap proof
                " IF p_key IS NOT NULL THEN"
                "  INSERT INTO {idem} (tenant, key, fingerprint, command_type, aggregate_id, stream_version, outcome" +
                record_columns + ")"
                "  VALUES (p_tenant, p_key, p_fingerprint, p_command_type, p_aggregate_id, p_stream_version,"
                "  p_outcome" + record_values + ");"
                " END IF; " + keys_insert + insert +
                " EXCEPTION WHEN OTHERS THEN"
                "  GET STACKED DIAGNOSTICS refused = RETURNED_SQLSTATE, detail = CONSTRAINT_NAME;"
                "  IF refused <> '23505' THEN detail := SQLERRM; END IF;"
                "  ids := NULL;"
                " END $$")

        def refuse_if(short: str, first_id: str, first_version: str) -> str:
            return (" IF " + short + " THEN RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation', CONSTRAINT = '" +
                    self.events + "_predecessor', MESSAGE = format('the append to stream %s from version %s does "
                    "not continue the stream''s stored history: an event''s predecessor is not stored with the hash "
                    "it chains from', " +
                    first_id + ", " + first_version + "); END IF;") if proven else ""

        columns = "INSERT INTO {events} (" + EVENT_COLUMNS + ") "
        if not proven:
            many = ("WITH inserted AS (" + columns + "SELECT * FROM unnest(p_ids, p_versions, p_topics, p_states, "
                    "p_prevs, p_hashes) RETURNING notification_id) ")
            one = columns + "VALUES (p_id, p_version, p_topic, p_state, p_prev, p_hash) "
        else:
            many = ("WITH batch AS (SELECT * FROM unnest(p_ids, p_versions, p_topics, p_states, p_prevs, p_hashes) "
                    "AS n(" + EVENT_COLUMNS + ")), inserted AS (" + columns + "SELECT * FROM batch n WHERE " +
                    self.continues("n", "batch") + " RETURNING notification_id) ")
            one = (columns + "SELECT * FROM (VALUES (p_id, p_version, p_topic, p_state, p_prev, p_hash)) AS n(" +
                   EVENT_COLUMNS + ") WHERE " + self.continues("n") + " ")
        many_name, one_name = ("{append_keyed}", "{append_one_keyed}") if keyed else ("{append}", "{append_one}")
        return [
            function(many_name, "p_ids {id_type}[], p_versions int8[], p_topics text[], p_states bytea[], "
                     "p_prevs bytea[], p_hashes bytea[]",
                     many + "SELECT array_agg(notification_id ORDER BY notification_id) INTO ids FROM inserted;" +
                     refuse_if("cardinality(ids) IS DISTINCT FROM cardinality(p_ids)", "p_ids[1]", "p_versions[1]")),
            function(one_name, "p_id {id_type}, p_version int8, p_topic text, p_state bytea, p_prev bytea, "
                     "p_hash bytea",
                     one + "RETURNING notification_id INTO one; ids := ARRAY[one];" +
                     refuse_if("one IS NULL", "p_id", "p_version")),
        ]


def store_schema_statements(schema: str) -> list[Composed]:
    """The DDL of the event store's tables (migration 1)."""
    return EventTables(schema).create_statements()


def store_append_function_statements(schema: str) -> list[Composed]:
    """The DDL of the store's append functions as migration 6 released them."""
    return EventTables(schema).append_functions(proven=False)


def store_proven_append_statements(schema: str) -> list[Composed]:
    """The DDL of the store's append functions that prove each event's predecessor (migration 11), used by
    ``EventRecorder.append_batch``."""
    return EventTables(schema).append_functions()


def store_keyed_append_statements(schema: str) -> list[Composed]:
    """The DDL of the store's append functions that also insert the data keys of the new subjects the events are
    sealed for (migration 13), used by ``EventRecorder.append_batch`` for the commands that have any."""
    return EventTables(schema).append_functions(keyed=True)


def store_referenced_record_statements(schema: str) -> list[Composed]:
    """Migration 14: idempotency records that refer to their command's events (``idempotency_references``), and
    the append functions (proven, and keyed) that take such a record's parameters, used by
    ``EventRecorder.append_batch``."""
    tables = EventTables(schema)
    return [*tables.idempotency_references(), *tables.append_functions(referenced=True),
            *tables.append_functions(keyed=True, referenced=True)]
