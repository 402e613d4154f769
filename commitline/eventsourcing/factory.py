"""The infrastructure factory ``eventsourcing`` finds in ``commitline.eventsourcing``.

It reads the library's PostgreSQL environment unchanged (``BasePostgresFactory``: ``POSTGRES_DBNAME``,
``POSTGRES_HOST``, ``POSTGRES_PORT``, ``POSTGRES_USER``, ``POSTGRES_PASSWORD`` or
``POSTGRES_GET_PASSWORD_TOPIC``, ``POSTGRES_SCHEMA``, pool sizes and timeouts, ``CREATE_TABLE``,
``ORIGINATOR_ID_TYPE``, ``SINGLE_ROW_TRACKING``) and names tables per application as the stock
factory does; only the recorder classes differ. ``POSTGRES_ENABLE_DB_FUNCTIONS`` and
``POSTGRES_LOCK_TIMEOUT`` have nothing to act on: no table lock is ever taken.
"""

from __future__ import annotations

from eventsourcing.postgres import PostgresFactory

from commitline.eventsourcing.recorders import (
    CommitlineAggregateRecorder,
    CommitlineApplicationRecorder,
    CommitlineProcessRecorder,
    CommitlineTrackingRecorder,
)


class CommitlineFactory(PostgresFactory):
    aggregate_recorder_class = CommitlineAggregateRecorder
    application_recorder_class = CommitlineApplicationRecorder
    tracking_recorder_class = CommitlineTrackingRecorder
    process_recorder_class = CommitlineProcessRecorder
