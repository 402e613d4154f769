"""A small table of one schema read and written one statement at a time, over any source of connections
(``datastore.get_connection``): the operators' tables (``api_keys``, ``audit_runs``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier


class SmallTable:
    table_name: ClassVar[str]

    def __init__(self, connection: Callable[[], AbstractContextManager[Any]], schema: str):
        self._connection = connection
        self.table = Identifier(schema, self.table_name)

    def _run(self, query: str, params: tuple[Any, ...] = (), **names: Identifier) -> list[tuple[Any, ...]]:
        """``query`` (``{t}`` is the table, other names as given) on a connection of its own; its rows, if any."""
        conn: psycopg.Connection[Any]
        with self._connection() as conn:
            cur = conn.cursor(row_factory=tuple_row).execute(SQL(query).format(t=self.table, **names), params)
            return cur.fetchall() if cur.description else []

    def _read(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read, ``query`` rendered beforehand (``Composed.as_string``), in one round trip: the
        statement alone, in autocommit, with no BEGIN and COMMIT around it (the connection goes back to the pool
        as it came)."""
        conn: psycopg.Connection[Any]
        with self._connection() as conn:
            before, conn.autocommit = conn.autocommit, True
            try:
                return conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()
            finally:
                if not conn.closed:
                    conn.autocommit = before
