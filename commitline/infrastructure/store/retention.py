"""The idempotency retention job: the only way idempotency records ever go away.

Records older than the retention period are deleted in small batches (short transactions,
no long locks). Choose a period longer than any client's retry window: a retry arriving
after its record expired is treated as a new command. (The domain still refuses most such
repeats: a second create finds the aggregate, a repeated transition is illegal.) Expired
records also stop serving as witnesses of a stream's last version for ``audit verify``.
"""

from __future__ import annotations

from datetime import timedelta

from eventsourcing.postgres import PostgresDatastore
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.infrastructure.store.schema import IDEMPOTENCY_TABLE

BATCH = 5_000


def expire_idempotency_records(datastore: PostgresDatastore, older_than: timedelta, *, dry_run: bool = False) -> int:
    """Delete (or, with ``dry_run``, count) records recorded more than ``older_than`` ago."""
    if older_than <= timedelta(0):
        raise ValueError("the retention period must be positive")
    table = Identifier(datastore.schema, IDEMPOTENCY_TABLE)
    with datastore.get_connection() as conn:
        cur = conn.cursor(row_factory=tuple_row)
        if dry_run:
            return int(cur.execute(SQL("SELECT count(*) FROM {} WHERE recorded_at < now() - %s").format(table),
                                   (older_than,)).fetchone()[0])
        deleted = 0
        while True:
            cur.execute(SQL("DELETE FROM {t} WHERE (tenant, key) IN (SELECT tenant, key FROM {t} "
                            "WHERE recorded_at < now() - %s LIMIT %s)").format(t=table), (older_than, BATCH))
            deleted += cur.rowcount
            if cur.rowcount < BATCH:
                return deleted
