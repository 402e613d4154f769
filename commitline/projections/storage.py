"""SQL for read-model tables: create them, read the rows a batch needs, write a batch.

A batch is written as one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO UPDATE``
per table: counters add (``t.c + excluded.c``), values overwrite when given
(``COALESCE(excluded.v, t.v)``). Only the projector of a projection writes its tables,
so these upserts never wait on one another.

A projection whose stored tables have another shape than it declares (a column added,
removed or retyped by another commitline version) is detected by comparing the declaration
with ``information_schema.columns`` (``check_shape``); the projector then refuses to start
with ``ProjectionNeedsRebuild``, which names the differences and the rebuild command.

A personal value whose subject was erased reaches a handler as ``ERASED``; copied into a row it is written
as ``{"erased": true}`` in a text or JSON column, and as no value (NULL) in a column of any other type.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.domain.personal import ERASED_JSON, Erased
from commitline.projections.base import Changes, Key, Projection, Table

REBUILD_SUFFIX = "__next"
_ERASED_TEXT = json.dumps(ERASED_JSON)
_TEXT_TYPES = ("text", "varchar", "character varying", "json", "jsonb", "citext")


def table_ident(schema: str, table: Table, suffix: str = "") -> Identifier:
    return Identifier(schema, table.name + suffix)


def create_tables(conn: psycopg.Connection[Any], schema: str, projection: Projection, suffix: str = "") -> None:
    for table in projection.tables:
        columns = SQL(", ").join(
            SQL("{} {}{}").format(Identifier(name), SQL(sql_type), SQL(" NOT NULL DEFAULT 0" if name in table.counters
                                                                         else " NOT NULL" if name in table.key else ""))
            for name, sql_type in table.columns.items()
        )
        conn.execute(SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
            table_ident(schema, table, suffix), columns, SQL(", ").join(map(Identifier, table.key))))


class ProjectionNeedsRebuild(RuntimeError):
    """A projection's tables exist with another shape than it declares (a newer or older commitline made
    them): it must not write into them. The message names the projection, the differences and the command."""

    def __init__(self, projection: str, differences: list[str]):
        self.projection, self.differences = projection, differences
        self.command = rebuild_command(projection)
        super().__init__(f"projection {projection} needs a rebuild: its tables differ from what it declares "
                         f"({'; '.join(differences)}); run `{self.command}`")


def rebuild_command(projection: str, *, fresh: bool = False) -> str:
    return f"commitline projections rebuild {projection}" + (" --fresh" if fresh else "")


Shape = dict[str, dict[str, str]]  # table -> column -> type (PostgreSQL's internal type name, e.g. int8)


def shape_differences(declared: Shape, stored: Shape) -> list[str]:
    """What differs between the declared and the stored tables; nothing when no table is stored yet (a
    first start creates them all) or when they match. Types are compared as PostgreSQL names them."""
    if not stored:
        return []
    differences = []
    for table, columns in declared.items():
        found = stored.get(table)
        if found is None:
            differences.append(f"table {table} is missing")
            continue
        differences += [f"{table}.{c} is missing" for c in columns if c not in found]
        differences += [f"{table}.{c} is not declared" for c in found if c not in columns]
        differences += [f"{table}.{c} is {found[c]}, declared {t}" for c, t in columns.items()
                        if c in found and found[c] != t]
    return differences


def declared_shape(conn: psycopg.Connection[Any], projection: Projection) -> Shape:
    """The declared columns, with each type resolved by PostgreSQL (``bigint`` -> ``int8``)."""
    types = sorted({t for table in projection.tables for t in table.columns.values()})
    rows = conn.cursor(row_factory=tuple_row).execute(
        "SELECT t, coalesce((SELECT typname FROM pg_type WHERE oid = to_regtype(t)), t) "
        "FROM unnest(%s::text[]) AS t", (types,)).fetchall()
    resolved = dict(rows)
    return {table.name: {c: resolved[t] for c, t in table.columns.items()} for table in projection.tables}


def stored_shape(conn: psycopg.Connection[Any], schema: str, projection: Projection, suffix: str = "") -> Shape:
    """The columns of those of the projection's tables that exist (``information_schema.columns``)."""
    names = {table.name + suffix: table.name for table in projection.tables}
    shape: Shape = {}
    for table, column, udt in conn.cursor(row_factory=tuple_row).execute(
            "SELECT table_name, column_name, udt_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = ANY(%s) ORDER BY ordinal_position",
            (schema, list(names))).fetchall():
        shape.setdefault(names[table], {})[column] = udt
    return shape


def check_shape(conn: psycopg.Connection[Any], schema: str, projection: Projection) -> list[str]:
    """The differences between the projection's live tables and its declaration (see ``shape_differences``)."""
    return shape_differences(declared_shape(conn, projection), stored_shape(conn, schema, projection))


def table_exists(conn: psycopg.Connection[Any], schema: str, projection: Projection, suffix: str = "") -> bool:
    """True when the projection's (first) table exists: it has run, or a rebuild has begun."""
    name = f'"{schema}"."{projection.tables[0].name}{suffix}"'
    row = conn.cursor(row_factory=tuple_row).execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def drop_tables(conn: psycopg.Connection[Any], schema: str, projection: Projection, suffix: str) -> None:
    for table in projection.tables:
        conn.execute(SQL("DROP TABLE IF EXISTS {}").format(table_ident(schema, table, suffix)))


def swap_in(conn: psycopg.Connection[Any], schema: str, projection: Projection) -> None:
    """Replace the live tables by the rebuilt ones; call inside the transaction that moves the position."""
    live = [table_ident(schema, t) for t in projection.tables]
    conn.execute(SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(SQL(", ").join(live)))
    for table in projection.tables:
        conn.execute(SQL("DROP TABLE {}").format(table_ident(schema, table)))
        conn.execute(SQL("ALTER TABLE {} RENAME TO {}").format(table_ident(schema, table, REBUILD_SUFFIX),
                                                              Identifier(table.name)))


def load_rows(conn: psycopg.Connection[Any], schema: str, table: Table, keys: set[Key], suffix: str = ""
              ) -> dict[Key, dict[str, Any]]:
    key_columns = SQL(", ").join(map(Identifier, table.key))
    arrays = SQL(", ").join(SQL("%s::{}[]").format(SQL(table.columns[k])) for k in table.key)
    ordered = list(keys)
    params = [[k[i] for k in ordered] for i in range(len(table.key))]
    rows = conn.cursor(row_factory=dict_row).execute(
        SQL("SELECT * FROM {} WHERE ({}) IN (SELECT * FROM unnest({}))").format(
            table_ident(schema, table, suffix), key_columns, arrays), params).fetchall()
    return {tuple(row[k] for k in table.key): row for row in rows}


def write_changes(conn: psycopg.Connection[Any], schema: str, changes: Changes, suffix: str = "") -> None:
    for name, rows in changes.rows.items():
        if rows:
            table = changes.tables[name]
            statement, params = _upsert(schema, table, rows, suffix)
            conn.execute(statement, params)


def _stored(value: Any, sql_type: str) -> Any:
    if isinstance(value, Erased):
        return _ERASED_TEXT if sql_type.split("(")[0].strip().lower() in _TEXT_TYPES else None
    return value


def _upsert(schema: str, table: Table, rows: dict[Key, dict[str, Any]], suffix: str) -> tuple[Composed, list[Any]]:
    columns = list(table.columns)
    keys = list(rows)
    params: list[Any] = []
    for column in columns:
        if column in table.key:
            index = table.key.index(column)
            params.append([k[index] for k in keys])
        elif column in table.counters:
            params.append([rows[k].get(column, 0) for k in keys])
        else:
            params.append([_stored(rows[k].get(column), table.columns[column]) for k in keys])
    target = table_ident(schema, table, suffix)
    updates = [SQL("{c} = t.{c} + excluded.{c}").format(c=Identifier(c)) for c in table.counters]
    updates += [SQL("{c} = COALESCE(excluded.{c}, t.{c})").format(c=Identifier(c)) for c in table.values]
    statement = SQL("INSERT INTO {} AS t ({}) SELECT * FROM unnest({}) ON CONFLICT ({}) DO {}").format(
        target,
        SQL(", ").join(map(Identifier, columns)),
        SQL(", ").join(SQL("%s::{}[]").format(SQL(table.columns[c])) for c in columns),
        SQL(", ").join(map(Identifier, table.key)),
        SQL("UPDATE SET ") + SQL(", ").join(updates) if updates else SQL("NOTHING"),
    )
    return statement, params
