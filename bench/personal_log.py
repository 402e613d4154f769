"""Pre-filling a store of the ``personal_data`` benchmark's domain quickly (measures nothing itself).

- :func:`add_keys`: one data key per holder, wrapped under the bench's master key as the store wraps its own,
  written with one ``COPY`` (one ``INSERT`` per subject, as commands add them, would take minutes for 100,000);
- :func:`write_log`: per holder ``HolderOpened`` then ``EmailChanged`` up to version ``per_holder``, encoded by
  the store's own codec (each email sealed under its holder's key when the domain declares it personal) and
  written through ``recorder.append`` in transactions of ``CHUNK`` events, which hash-chains every stream as a
  command's append does (one chunk is encoded while the one before it is written). The emails depend only on (holder number, version), so a sealed and a plain log of the
  same holders hold the same values.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from uuid import UUID, uuid4

import psycopg
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eventsourcing.persistence import StoredEvent
from psycopg.sql import SQL, Identifier

from bench.harness import MASTER_KEY
from bench.personal_domain import BenchDomain
from commitline.composition import Commitline
from commitline.infrastructure.personal.cipher import PersonalData
from commitline.infrastructure.personal.keys import DATA_KEYS_TABLE, DataKeys
from commitline.infrastructure.personal.master import KEY_BYTES, MasterKey
from commitline.infrastructure.store.codec import EventCodec

TENANT = "default"
CHUNK = 5_000  # stored events per append transaction


def email(number: int, version: int) -> str:
    return f"h{number}.v{version}@example{number % 7}.org"


def add_keys(app: Commitline, dsn: str, schema: str, holders: list[UUID]) -> PersonalData:
    """A data key for each of ``holders``, stored; a ``PersonalData`` holding them all, that never lets them
    expire (the store's own would re-read every key after 30 s, one statement each, mid-way through a long fill)."""
    master = MasterKey.parse(MASTER_KEY)
    rows = []
    for holder in holders:
        key_id, subject = uuid4(), str(holder)
        wrapped = master.wrap(AESGCM.generate_key(bit_length=KEY_BYTES * 8), str(key_id), TENANT, subject)
        rows.append((key_id, TENANT, subject, wrapped, master.key_id))
    with psycopg.connect(dsn) as conn, conn.cursor().copy(
            SQL("COPY {} (key_id, tenant, subject, wrapped, master_key_id) FROM STDIN").format(
                Identifier(schema, DATA_KEYS_TABLE))) as copy:
        for row in rows:
            copy.write_row(row)
    personal = PersonalData(DataKeys(app.datastore.get_connection, schema), lambda: master,
                            ttl_s=float("inf"), size=len(holders) + 1)
    for start in range(0, len(rows), 50_000):
        personal.preload(row[0] for row in rows[start:start + 50_000])
    return personal


def stored_events(bench: BenchDomain, codec: EventCodec, holders: list[UUID], per_holder: int) -> Iterator[StoredEvent]:
    at = datetime.now(UTC)
    for number, holder_id in enumerate(holders):
        holder = bench.holder.blank(holder_id)  # names the subject (its ``holder``) for the codec
        for version in range(1, per_holder + 1):
            cls = bench.opened if version == 1 else bench.changed
            event = cls(event_id=uuid4(), aggregate_id=holder_id, version=version, occurred_at=at,  # type: ignore[call-arg]
                        email=email(number, version))
            yield codec.encode(event, TENANT, aggregate=holder)


def write_log(app: Commitline, bench: BenchDomain, holders: list[UUID], per_holder: int,
              personal: PersonalData | None) -> int:
    """Append ``len(holders) * per_holder`` events; their count."""
    codec = EventCodec(bench.domain.registry, personal)
    events = stored_events(bench, codec, holders, per_holder)
    written = 0
    with ThreadPoolExecutor(1) as appender:  # the next chunk is encoded while the last one is written
        pending: Future[list[int]] | None = None
        while chunk := list(itertools.islice(events, CHUNK)):
            if pending is not None:
                pending.result()  # in order: a stream split over two chunks continues from the stored hash
            pending = appender.submit(app.recorder.append, chunk)
            written += len(chunk)
        if pending is not None:
            pending.result()
    return written
