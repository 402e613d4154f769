"""The data keys of each (tenant, data subject), wrapped under the master key, and the record of erasures.

``data_keys`` is the one table of the store whose rows are deleted: erasing a subject deletes its key in the
same transaction that appends its row to ``erasures`` (when, tenant, subject, key id, by whom; no personal
value), which, like the events, rejects UPDATE, DELETE and TRUNCATE. The same transaction notifies the
erased key's id on ``erasure_channel(schema)`` (delivered at its commit), so every running process forgets the
key at once (``erasure_watch.py``). A key's row holds only its wrapped form and the id of the master key that
wrapped it; rotation rewraps the rows in batches (``rewrap``).

``master_keys`` records the id (never the key) of each master key the store's processes wrap data keys under,
and when a rotation retired it: once every subject is erased no data key is left to tell a wrong master key
by, and the record still does (``claim_master``).

A command that seals values under a new subject's key inserts that key in its own append's transaction
(``store/statements.py``, ``store/schema.py``: ``new_key_statement``), plainly: if the subject got a key first,
the unique (tenant, subject) refuses the append, which is sealed again under that key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.application.errors import WrongMasterKey
from commitline.infrastructure.personal.master import MasterKey
from commitline.infrastructure.store.small_table import SmallTable

DATA_KEYS_TABLE = "data_keys"
ERASURES_TABLE = "erasures"
MASTER_KEYS_TABLE = "master_keys"
_COLUMNS = "key_id, tenant, subject, wrapped, master_key_id"


def erasure_channel(schema: str) -> str:
    """The NOTIFY channel of the schema's erasures; each notification's payload is one erased key id."""
    return f"{schema}_data_keys_erased"


def master_key_statements(schema: str) -> list[Composed]:
    """The DDL of ``master_keys`` (a schema migration)."""
    return [SQL("CREATE TABLE IF NOT EXISTS {} (master_key_id text PRIMARY KEY, "
                "first_used_at timestamptz NOT NULL DEFAULT now(), retired_at timestamptz)").format(
        Identifier(schema, MASTER_KEYS_TABLE))]


#: The SQLSTATE of a data key refused because a rotation retired the master key that wrapped it
#: (``retired_master_statements``).
RETIRED_MASTER_KEY = "CLK01"


def retired_master_statements(schema: str) -> list[Composed]:
    """The DDL (a schema migration) of a trigger refusing a data key wrapped under a master key a rotation retired:
    a process started with the old key alone before the rotation would otherwise go on making keys that the
    processes with the new key cannot open, and that the next rotation refuses. Its SQLSTATE is
    ``RETIRED_MASTER_KEY``; inside an append it refuses that command alone."""
    names = {"keys": Identifier(schema, DATA_KEYS_TABLE), "masters": Identifier(schema, MASTER_KEYS_TABLE),
             "refuse": Identifier(schema, "refuse_retired_master_key")}
    return [SQL(text).format(**names) for text in (
        "CREATE OR REPLACE FUNCTION {refuse}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF EXISTS (SELECT FROM {masters} WHERE master_key_id = NEW.master_key_id AND retired_at IS NOT NULL) THEN "
        "RAISE EXCEPTION 'the master key % was retired by a rotation: no data key is wrapped under it any more', "
        "NEW.master_key_id USING ERRCODE = '" + RETIRED_MASTER_KEY + "'; END IF; RETURN NEW; END $$",
        "CREATE OR REPLACE TRIGGER data_keys_under_a_retired_master BEFORE INSERT ON {keys} "
        "FOR EACH ROW EXECUTE FUNCTION {refuse}()",
    )]


def retired_master(master_key_id: str) -> WrongMasterKey:
    """The error of a data key refused by ``retired_master_statements``' trigger."""
    return WrongMasterKey(reason=f"the master key {master_key_id} this process wraps new data keys under was retired "
                          "by a rotation: restart it with the key it was rotated to in COMMITLINE_MASTER_KEY; nothing "
                          "was written")


def create_statements(schema: str) -> list[Composed]:
    """The DDL of both tables (a schema migration)."""
    names = {"keys": Identifier(schema, DATA_KEYS_TABLE), "erasures": Identifier(schema, ERASURES_TABLE),
             "reject": Identifier(schema, "reject_erasure_change")}
    return [SQL(text).format(**names) for text in (
        "CREATE TABLE IF NOT EXISTS {keys} (key_id uuid PRIMARY KEY, tenant text NOT NULL, subject text NOT NULL,"
        " wrapped bytea NOT NULL, master_key_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),"
        " UNIQUE (tenant, subject))",
        "CREATE INDEX IF NOT EXISTS data_keys_master_key_id ON {keys} (master_key_id)",
        "CREATE TABLE IF NOT EXISTS {erasures} (erasure_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " tenant text NOT NULL, subject text NOT NULL, key_id uuid NOT NULL,"
        " erased_at timestamptz NOT NULL DEFAULT now(), erased_by text NOT NULL)",
        "CREATE OR REPLACE FUNCTION {reject}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'erasures are append-only: % on %.% rejected', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME "
        "USING ERRCODE = 'restrict_violation'; END $$",
        "CREATE OR REPLACE TRIGGER erasures_append_only BEFORE UPDATE OR DELETE ON {erasures} "
        "FOR EACH ROW EXECUTE FUNCTION {reject}()",
        "CREATE OR REPLACE TRIGGER erasures_no_truncate BEFORE TRUNCATE ON {erasures} "
        "FOR EACH STATEMENT EXECUTE FUNCTION {reject}()",
    )]


@dataclass(frozen=True)
class KeyRow:
    key_id: UUID
    tenant: str
    subject: str
    wrapped: bytes = b""
    master_key_id: str = ""


@dataclass(frozen=True)
class Erasure:
    """One erased data key: no personal value, only whose it was and when."""

    tenant: str
    subject: str
    key_id: UUID
    erased_at: datetime
    erased_by: str


@dataclass(frozen=True)
class Rotation:
    """What ``rewrap`` did: rows rewrapped now, rows already under the new key, the new key's id."""

    rewrapped: int
    already: int
    master_key_id: str


def _row(values: tuple) -> KeyRow:  # type: ignore[type-arg]
    key_id, tenant, subject, wrapped, master_key_id = values
    return KeyRow(key_id, tenant, subject, bytes(wrapped), master_key_id)


class DataKeys(SmallTable):
    """The data keys of one schema, over any source of connections (``datastore.get_connection``)."""

    table_name = DATA_KEYS_TABLE

    def __init__(self, connection: Callable[[], object], schema: str):
        super().__init__(connection, schema)  # type: ignore[arg-type]
        self.erasures = Identifier(schema, ERASURES_TABLE)
        self.master_keys = Identifier(schema, MASTER_KEYS_TABLE)
        self.channel = erasure_channel(schema)

    def find_or_add(self, new: KeyRow) -> KeyRow:
        """The subject's key: ``new`` inserted if it has none, else the one it has (one round trip, usually)."""
        try:
            rows = self._added(new)
        except psycopg.Error as e:
            if e.sqlstate == RETIRED_MASTER_KEY:
                raise retired_master(new.master_key_id) from None
            raise
        if not rows:  # another process added it after this statement's snapshot was taken
            rows = self._run("SELECT " + _COLUMNS + " FROM {t} WHERE tenant = %s AND subject = %s",
                             (new.tenant, new.subject))
        return _row(rows[0])

    def _added(self, new: KeyRow) -> list[tuple]:  # type: ignore[type-arg]
        return self._run(
            "WITH added AS (INSERT INTO {t} (" + _COLUMNS + ") VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (tenant, subject) DO NOTHING RETURNING " + _COLUMNS + ") "
            "SELECT " + _COLUMNS + " FROM added UNION ALL "
            "SELECT " + _COLUMNS + " FROM {t} WHERE tenant = %s AND subject = %s AND NOT EXISTS (SELECT FROM added)",
            (new.key_id, new.tenant, new.subject, new.wrapped, new.master_key_id, new.tenant, new.subject))

    def find(self, tenant: str, subject: str) -> KeyRow | None:
        """The subject's key, if it has one (a read: nothing is written)."""
        rows = self._run("SELECT " + _COLUMNS + " FROM {t} WHERE tenant = %s AND subject = %s", (tenant, subject))
        return _row(rows[0]) if rows else None

    def claim_master(self, master_key_ids: Sequence[str]) -> str | None:
        """Check the configured master keys (``master_key_ids``: the current one first, then the previous one
        mid-rotation) against the store; when they pass, record the current one as in use and return None, else
        return why not. They pass when a data key is wrapped under one of them, or when there is no data key and
        the store has recorded no master key in use but them (none at all on a new store, or one from before
        this record), and the current one was not retired by a rotation (a process given the old key again would
        make keys the others cannot open). In one transaction holding the record's lock, so two processes with
        different keys on an empty store cannot both pass."""
        ids = list(master_key_ids)
        try:
            return self._claim(ids, lock=True)
        except psycopg.errors.ReadOnlySqlTransaction:  # a read-only server (a hot standby): check, record nothing
            return self._claim(ids, lock=False)

    def check_master(self, master_key_ids: Sequence[str]) -> str | None:
        """Why the configured master keys no longer pass ``claim_master``'s check (a rotation retired the current
        one since, say), or None: a read, nothing recorded."""
        return self._claim(list(master_key_ids), lock=False)

    def _claim(self, ids: list[str], lock: bool) -> str | None:
        with self._connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=tuple_row)
            if lock:
                cur.execute(SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(self.master_keys))
            ((mine, any_key, known, retired),) = cur.execute(SQL(
                "SELECT EXISTS (SELECT FROM {t} WHERE master_key_id = ANY(%s)), EXISTS (SELECT FROM {t}), "
                "ARRAY(SELECT master_key_id FROM {m} WHERE retired_at IS NULL ORDER BY first_used_at), "
                "(SELECT retired_at FROM {m} WHERE master_key_id = %s)").format(
                t=self.table, m=self.master_keys), (ids, ids[0])).fetchall()
            if retired is not None:
                return (f"it was retired by a rotation at {retired:%Y-%m-%d %H:%M:%S %Z}; configure the key it was "
                        "rotated to")
            wrapping = ("configure the key that wrapped them (mid-rotation, the old or the new one; in a rolling "
                        "rotation, the old one as COMMITLINE_PREVIOUS_MASTER_KEY)")
            if any_key and not mine:
                return f"no data key is wrapped under it; {wrapping}"
            if not any_key and known and not set(ids) & set(known):
                return (f"the store's data keys were wrapped under {' and '.join(known)} (every one since erased, "
                        f"so none is left to open); {wrapping}")
            if lock:
                cur.execute(SQL("INSERT INTO {} (master_key_id) VALUES (%s) ON CONFLICT (master_key_id) DO NOTHING")
                            .format(self.master_keys), (ids[0],))
        return None

    def get(self, key_id: UUID) -> KeyRow | None:
        rows = self._run("SELECT " + _COLUMNS + " FROM {t} WHERE key_id = %s", (key_id,))
        return _row(rows[0]) if rows else None

    def get_many(self, key_ids: list[UUID]) -> list[KeyRow]:
        """The rows of those of ``key_ids`` that exist (an erased key has none), in one statement."""
        return [_row(r) for r in self._run("SELECT " + _COLUMNS + " FROM {t} WHERE key_id = ANY(%s)", (key_ids,))]

    def erase(self, tenant: str, subject: str, by: str) -> list[Erasure]:
        """Delete the subject's key and record the erasure, in one transaction, which notifies the key's id to
        every listening process when it commits; nothing when the subject has no key."""
        with self._connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=tuple_row)
            deleted = cur.execute(SQL("DELETE FROM {} WHERE tenant = %s AND subject = %s RETURNING key_id").format(
                self.table), (tenant, subject)).fetchall()
            done = []
            for (key_id,) in deleted:
                (at,) = cur.execute(SQL("INSERT INTO {} (tenant, subject, key_id, erased_by) VALUES (%s, %s, %s, %s) "
                                        "RETURNING erased_at").format(self.erasures),
                                    (tenant, subject, key_id, by)).fetchone()
                cur.execute("SELECT pg_notify(%s, %s)", (self.channel, str(key_id)))
                done.append(Erasure(tenant, subject, key_id, at, by))
        return done

    def erased(self, tenant: str | None = None) -> list[Erasure]:
        """Every erasure recorded (of ``tenant`` only, if given), oldest first."""
        where, params = ("WHERE tenant = %s", (tenant,)) if tenant is not None else ("", ())
        rows = self._run(f"SELECT tenant, subject, key_id, erased_at, erased_by FROM {{e}} {where} "
                         "ORDER BY erasure_id", params, e=self.erasures)
        return [Erasure(*row) for row in rows]

    def rewrap(self, current: MasterKey, new: MasterKey, batch: int = 500) -> Rotation:
        """Rewrap every key under ``current`` with ``new``, ``batch`` rows per transaction; rows already under
        ``new`` are left as they are, so a rotation cut short is finished by running it again. Refused
        (WrongMasterKey, before any row changes) while a row is under a third key."""
        if new.key_id == current.key_id:
            raise WrongMasterKey(reason=f"the new master key is the configured one ({current.key_id}): give another")
        others = self._run("SELECT master_key_id, count(*) FROM {t} WHERE master_key_id NOT IN (%s, %s) "
                           "GROUP BY master_key_id ORDER BY master_key_id", (current.key_id, new.key_id))
        if others:
            found = ", ".join(f"{n} under {key_id}" for key_id, n in others)
            raise WrongMasterKey(reason=f"data keys are wrapped under a master key that is neither {current.key_id}, "
                                 f"which they are rewrapped from, nor {new.key_id}, which they are rewrapped to "
                                 f"({found}): configure the key that wrapped them first; nothing was rewrapped")
        rewrapped = 0
        while True:
            with self._connection() as conn, conn.transaction():
                cur = conn.cursor(row_factory=tuple_row)
                rows = [_row(r) for r in cur.execute(SQL(
                    "SELECT " + _COLUMNS + " FROM {} WHERE master_key_id = %s ORDER BY key_id LIMIT %s "
                    "FOR UPDATE SKIP LOCKED").format(self.table), (current.key_id, batch)).fetchall()]
                if not rows:
                    break
                cur.executemany(SQL("UPDATE {} SET wrapped = %s, master_key_id = %s WHERE key_id = %s").format(
                    self.table), [(new.wrap(current.unwrap(r.wrapped, r.master_key_id, str(r.key_id), r.tenant,
                                                           r.subject), str(r.key_id), r.tenant, r.subject),
                                   new.key_id, r.key_id) for r in rows])
                rewrapped += len(rows)
        with self._connection() as conn, conn.transaction():  # the record: the new key in use, the old retired
            cur = conn.cursor(row_factory=tuple_row)
            # keys being added under the old one (a process that still has it alone) are committed, and counted
            # below, before it is retired; those added after are refused by the trigger (``retired_master``)
            cur.execute(SQL("LOCK TABLE {} IN SHARE MODE").format(self.table))
            cur.execute(SQL("INSERT INTO {m} (master_key_id) VALUES (%s) ON CONFLICT (master_key_id) DO UPDATE "
                            "SET retired_at = NULL").format(m=self.master_keys), (new.key_id,))
            cur.execute(SQL("UPDATE {m} SET retired_at = now() WHERE master_key_id = %s AND retired_at IS NULL "
                            "AND NOT EXISTS (SELECT FROM {t} WHERE master_key_id = %s)").format(
                m=self.master_keys, t=self.table), (current.key_id, current.key_id))
            (already,) = cur.execute(SQL("SELECT count(*) FROM {} WHERE master_key_id = %s").format(self.table),
                                     (new.key_id,)).fetchone()
        return Rotation(rewrapped, int(already) - rewrapped, new.key_id)
