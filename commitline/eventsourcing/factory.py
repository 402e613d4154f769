"""The infrastructure factory ``eventsourcing`` finds in ``commitline.eventsourcing``.

It reads the library's PostgreSQL environment unchanged (``BasePostgresFactory``: ``POSTGRES_DBNAME``,
``POSTGRES_HOST``, ``POSTGRES_PORT``, ``POSTGRES_USER``, ``POSTGRES_PASSWORD`` or
``POSTGRES_GET_PASSWORD_TOPIC``, ``POSTGRES_SCHEMA``, pool sizes and timeouts, ``CREATE_TABLE``,
``ORIGINATOR_ID_TYPE``, ``SINGLE_ROW_TRACKING``) and names tables per application as the stock
factory does; only the recorder classes differ. ``POSTGRES_ENABLE_DB_FUNCTIONS`` and
``POSTGRES_LOCK_TIMEOUT`` have nothing to act on: no table lock is ever taken.
"""

from __future__ import annotations

from typing import TypeVar

from eventsourcing.persistence import ApplicationRecorder, ProcessRecorder
from eventsourcing.postgres import PostgresFactory

from commitline.eventsourcing.recorders import (
    CommitlineAggregateRecorder,
    CommitlineApplicationRecorder,
    CommitlineProcessRecorder,
    CommitlineTrackingRecorder,
)

R = TypeVar("R", ApplicationRecorder, ProcessRecorder)


class CommitlineFactory(PostgresFactory):
    aggregate_recorder_class = CommitlineAggregateRecorder
    application_recorder_class = CommitlineApplicationRecorder
    tracking_recorder_class = CommitlineTrackingRecorder
    process_recorder_class = CommitlineProcessRecorder

    # With CREATE_TABLE off nothing is created, so ``create_table`` never runs its check of the events table: a
    # table the stock module made is refused here too, as the application is constructed, not at its first load.
    def application_recorder(self) -> ApplicationRecorder:
        return _checked(super().application_recorder(), self.env_create_table())

    def process_recorder(self) -> ProcessRecorder:
        return _checked(super().process_recorder(), self.env_create_table())


def _checked(recorder: R, created: bool) -> R:
    if not created and isinstance(recorder, CommitlineApplicationRecorder):  # else: checked as it was created
        recorder._refuse_stock_table()
    return recorder
