"""The record of hash-chain verifications: one row per ``commitline audit verify`` run, appended, never changed.

The operators' status page shows the last one (when it ran, OK or BROKEN, how many streams and events);
a verification nobody ran shows as none. A row holds counts and the scope only, never an event's
content: ``scope`` is ``all`` (every tenant's streams) or ``aggregate`` (one stream, ``aggregate_id`` of
``tenant``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.sql import SQL, Composed, Identifier

from commitline.infrastructure.store.small_table import SmallTable

AUDIT_RUNS_TABLE = "audit_runs"
ALL, AGGREGATE = "all", "aggregate"
_COLUMNS = "run_id, started_at, finished_at, scope, aggregate_id, tenant, ok, streams, events, broken, seconds"


def create_statements(schema: str) -> list[Composed]:
    """The DDL of the runs table, for the schema migrations."""
    return [SQL("CREATE TABLE IF NOT EXISTS {} ("
                " run_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " started_at timestamptz NOT NULL,"
                " finished_at timestamptz NOT NULL DEFAULT now(),"
                " scope text NOT NULL CHECK (scope IN ('all', 'aggregate')),"
                " aggregate_id uuid,"
                " tenant text,"
                " ok boolean NOT NULL,"
                " streams integer NOT NULL,"
                " events bigint NOT NULL,"
                " broken integer NOT NULL,"
                " seconds double precision NOT NULL)").format(Identifier(schema, AUDIT_RUNS_TABLE))]


def append_only_statements(schema: str) -> list[Composed]:
    """Triggers that reject UPDATE, DELETE and TRUNCATE on the runs table (a schema migration): a BROKEN run
    removed would show the status page an earlier OK one."""
    names = {"t": Identifier(schema, AUDIT_RUNS_TABLE), "reject": Identifier(schema, "reject_audit_run_change")}
    return [SQL(text).format(**names) for text in (
        "CREATE OR REPLACE FUNCTION {reject}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'audit runs are append-only: % on %.% rejected', TG_OP, TG_TABLE_SCHEMA, "
        "TG_TABLE_NAME USING ERRCODE = 'restrict_violation'; END $$",
        "CREATE OR REPLACE TRIGGER audit_runs_append_only BEFORE UPDATE OR DELETE ON {t} "
        "FOR EACH ROW EXECUTE FUNCTION {reject}()",
        "CREATE OR REPLACE TRIGGER audit_runs_no_truncate BEFORE TRUNCATE ON {t} "
        "FOR EACH STATEMENT EXECUTE FUNCTION {reject}()",
    )]


@dataclass(frozen=True)
class AuditRun:
    run_id: int
    started_at: datetime
    finished_at: datetime
    scope: str
    aggregate_id: UUID | None
    tenant: str | None
    ok: bool
    streams: int
    events: int
    broken: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "started_at": self.started_at.isoformat(),
                "finished_at": self.finished_at.isoformat(),
                "aggregate_id": str(self.aggregate_id) if self.aggregate_id else None}


class AuditRuns(SmallTable):
    """The verification runs of one schema, over any source of connections (``datastore.get_connection``)."""

    table_name = AUDIT_RUNS_TABLE

    def record(self, *, started_at: datetime, ok: bool, streams: int, events: int, broken: int, seconds: float,
               aggregate_id: UUID | None = None, tenant: str | None = None) -> AuditRun:
        """Append one finished run: of every stream, or (``aggregate_id``) of one stream of ``tenant``."""
        scope = ALL if aggregate_id is None else AGGREGATE
        (row,) = self._run(f"INSERT INTO {{t}} (started_at, scope, aggregate_id, tenant, ok, streams, events, broken, "
                           f"seconds) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}",
                           (started_at, scope, aggregate_id, tenant if aggregate_id is not None else None, ok,
                            streams, events, broken, seconds))
        return AuditRun(*row)

    def last(self, scope: str | None = None) -> AuditRun | None:
        """The most recent run (of ``scope`` only, if given), or None if none was recorded."""
        where, params = ("WHERE scope = %s", (scope,)) if scope is not None else ("", ())
        rows = self._run(f"SELECT {_COLUMNS} FROM {{t}} {where} ORDER BY run_id DESC LIMIT 1", params)
        return AuditRun(*rows[0]) if rows else None
