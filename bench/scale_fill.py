"""Filling a store as commands would have left it, quickly, for ``bench.scale`` (measures nothing itself).

Events: the examples' survey and inventory streams made by the aggregates' own command methods
(``projection_rebuild``'s generators: ``SurveyTask``, ``SurveyAssignment``, ``InventoryItem``, one after the
other), every aggregate in one of ``TENANTS`` tenants (a survey's assignments in its task's tenant), encoded by
the store's codec and written through ``recorder.append`` in transactions of ``CHUNK`` events with real
per-stream hash chains (computed here, continuing each stream across chunks).

One event is one command (every event of these streams comes from a command of its own), and for each the
idempotency record a dispatch writes beside it (migration 14's layout, ``Dispatch.append``): tenant, a random UUID
key (what clients send), the fingerprint (the first ``FINGERPRINT_BYTES`` of the SHA-256), the command type, the
aggregate, its version and the count of the command's events (one), no outcome: a replay reads the event back.
They go in by ``COPY`` after their chunk's
events (a command writes both in one transaction; the bytes on disk are the same).

``stock_copy``: the first ``sample`` of the same stored events (same topic, same state bytes) are also
inserted into the stock ``eventsourcing`` ``PostgresApplicationRecorder``'s own table, in a schema of its
own, so the bytes per event of both tables can be set side by side.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from uuid import UUID, uuid4

import orjson
import psycopg
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg.sql import SQL, Identifier
from pydantic_core import to_jsonable_python

from bench.example_log import inventory_events, survey_events
from commitline.application.chain import GENESIS, chain
from commitline.application.results import FINGERPRINT_BYTES
from commitline.composition import Commitline
from commitline.domain import Event
from commitline.infrastructure.store.codec import encode_event

TENANTS = 100
CHUNK = 5_000  # events (and idempotency records) per transaction
HEADS = 100_000  # streams whose last hash is kept: each generator finishes its streams within a few thousand events

#: event type -> (command type, aggregate type) of the command that records it
COMMANDS = {
    "SurveyTaskCreated": ("create_survey_task", "SurveyTask"),
    "SurveyTaskIssued": ("issue_survey_task", "SurveyTask"),
    "SurveyTaskAnswered": ("answer_survey_task", "SurveyAssignment"),
    "StockReceived": ("receive_stock", "InventoryItem"),
    "StockReserved": ("reserve_stock", "InventoryItem"),
    "ReservationReleased": ("release_reservation", "InventoryItem"),
    "ReservationFulfilled": ("fulfil_reservation", "InventoryItem"),
}

IDEMPOTENCY_COLUMNS = ("tenant", "key", "fingerprint", "command_type", "aggregate_id", "stream_version",
                       "event_count")
Row = tuple[str, str, bytes, str, UUID, int, int]


def tenant_of(e: Event) -> str:
    root: UUID = getattr(e, "task_id", e.aggregate_id)
    return f"tenant-{root.int % TENANTS:03d}"


def commands() -> Iterator[tuple[Event, str]]:
    """(event, tenant), surveys and inventory in turn, for ever."""
    for e in itertools.chain.from_iterable(zip(survey_events(), inventory_events())):
        yield e, tenant_of(e)


def idempotency_row(e: Event, tenant: str) -> Row:
    command_type, _ = COMMANDS[type(e).__name__]
    payload = to_jsonable_python(e.payload())
    request = {"type": command_type, "id": str(e.aggregate_id), **payload}
    fingerprint = hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).digest()[:FINGERPRINT_BYTES]
    return tenant, str(uuid4()), fingerprint, command_type, e.aggregate_id, e.version, 1


class Links:
    """Each stream's hash chain, continued across chunks (the last hash of the ``HEADS`` latest streams)."""

    def __init__(self) -> None:
        self.heads: OrderedDict[UUID, bytes] = OrderedDict()

    def __call__(self, events: list[StoredEvent]) -> list[tuple[bytes, bytes]]:
        out = []
        for e in events:
            if e.originator_version == 1:
                prev = GENESIS
            else:
                prev = self.heads.pop(e.originator_id, None)  # type: ignore[assignment]
                if prev is None:
                    raise RuntimeError(f"stream {e.originator_id} continued after its head was dropped")
            out.append(chain(prev, [e])[0])
            self.heads[e.originator_id] = out[-1][1]
            if len(self.heads) > HEADS:
                self.heads.popitem(last=False)
        return out


def stock_recorder(app: Commitline, schema: str) -> PostgresApplicationRecorder:
    """The stock library's application recorder (its table ``stored_events``) in ``schema``."""
    parts = app.settings.connection_parts()
    datastore = PostgresDatastore(parts["dbname"], parts["host"], parts["port"], parts["user"], parts["password"],
                                  schema=schema)
    recorder = PostgresApplicationRecorder(datastore)
    recorder.create_table()
    return recorder


class Filler:
    """Appends ``commands()`` to the app's store, chunk by chunk; ``fill(n)`` continues up to ``n`` events."""

    def __init__(self, app: Commitline, stock: PostgresApplicationRecorder | None = None, sample: int = 0):
        self.app, self.stock, self.sample = app, stock, sample
        self.source = commands()
        self.links = Links()
        self.written = self.stock_written = 0
        self.copy_sql = SQL("COPY {} ({}) FROM STDIN").format(
            Identifier(app.settings.schema_name, "idempotency_keys"), SQL(", ").join(map(Identifier,
                                                                                         IDEMPOTENCY_COLUMNS)))

    def _write(self, conn: psycopg.Connection[Any], events: list[StoredEvent], rows: list[Row],
               links: list[tuple[bytes, bytes]]) -> None:
        self.app.recorder.append(events, links=links)
        with conn.cursor().copy(self.copy_sql) as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
        if self.stock is not None and self.stock_written < self.sample:
            part = events[:self.sample - self.stock_written]
            self.stock.insert_events(part)
            self.stock_written += len(part)

    def fill(self, total: int) -> int:
        """Write events until ``total`` are stored by this filler; how many this call wrote."""
        before = self.written
        with psycopg.connect(**self.app.conninfo) as conn, ThreadPoolExecutor(1) as writer:
            pending: Future[None] | None = None  # the next chunk is built while the last one is written
            while self.written < total:
                n = min(CHUNK, total - self.written)
                events, rows = [], []
                for e, tenant in itertools.islice(self.source, n):
                    events.append(encode_event(e, tenant))
                    rows.append(idempotency_row(e, tenant))
                links = self.links(events)  # in order, before the chunk is handed over
                if pending is not None:
                    pending.result()
                pending = writer.submit(self._write, conn, events, rows, links)
                self.written += n
            if pending is not None:
                pending.result()
        return self.written - before
