"""Which event types, at which class versions, the store holds: so a process refuses, at start, a domain
that could not read them (an event type it does not declare, a version newer than its class, an old
version without the upcasters that bring it to the current one), before it writes or publishes anything.

A (type, version) pair is recorded before the first event of it commits: a process that appends one it
has not seen records it in a short transaction of its own first, so the table never lacks a pair the
events table holds (it may hold a pair whose append then failed, which only makes the check stricter).
Migration 7 fills it from the events a store held before it existed. Reading it at start is one small
query, however many events the store holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from psycopg.errors import UndefinedTable
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier

from commitline.infrastructure.store.schema import EVENTS_TABLE

EVENT_VERSIONS_TABLE = "event_versions"
Pair = tuple[str, int]  # (stored event type, class version)


def create_statements(schema: str) -> list[Composed]:
    """The table, and every pair the store already holds (migration 7)."""
    table = Identifier(schema, EVENT_VERSIONS_TABLE)
    return [
        SQL("CREATE TABLE IF NOT EXISTS {} (topic text NOT NULL, version integer NOT NULL, "
            "recorded_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (topic, version))").format(table),
        SQL("INSERT INTO {} (topic, version) SELECT DISTINCT topic, "
            "coalesce((convert_from(state, 'UTF8')::jsonb ->> 'v')::integer, 1) FROM {} "
            "ON CONFLICT DO NOTHING").format(table, Identifier(schema, EVENTS_TABLE)),
    ]


def stored_pairs(conn: Any, schema: str) -> set[Pair]:
    """Every pair recorded; none in a schema not migrated that far yet."""
    cur = conn.cursor(row_factory=tuple_row)
    exists = cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}"."{EVENT_VERSIONS_TABLE}"',)).fetchone()
    if not (exists and exists[0]):
        return set()
    rows = cur.execute(
        SQL("SELECT topic, version FROM {}").format(Identifier(schema, EVENT_VERSIONS_TABLE))).fetchall()
    return {(topic, int(version)) for topic, version in rows}


class EventVersions:
    """The pairs this process knows are recorded; ``ensure`` records new ones before their events are stored."""

    def __init__(self, connect: Callable[[], Any], schema: str, known: Iterable[Pair] = ()):
        self.connect = connect  # a context manager giving a connection (the datastore's pool)
        self.schema = schema
        self.known: set[Pair] = set(known)
        self._lock = threading.Lock()

    def ensure(self, pairs: Iterable[Pair]) -> None:
        new = [p for p in pairs if p not in self.known]
        if not new:
            return
        with self._lock:
            new = sorted({p for p in new if p not in self.known})
            if not new:
                return
            try:
                with self.connect() as conn, conn.transaction():
                    conn.cursor().executemany(
                        SQL("INSERT INTO {} (topic, version) VALUES (%s, %s) ON CONFLICT DO NOTHING").format(
                            Identifier(self.schema, EVENT_VERSIONS_TABLE)), new)
            except Exception as e:
                if isinstance(e, UndefinedTable) or isinstance(e.__cause__, UndefinedTable):
                    return  # a schema not migrated that far: migration 7 records what it holds then
                raise
            self.known.update(new)
