"""An ``eventsourcing`` persistence module backed by commitline's event store.

``Application(env={"PERSISTENCE_MODULE": "commitline.eventsourcing", "POSTGRES_DBNAME": ..., ...})``
persists through commitline's recorder: appends without a table lock, a notification log that
never passes an event still being committed, hash-chained streams, append-only tables, and
optional idempotency keys (``app.save(aggregate, idempotency_key="...")``). The environment is
eventsourcing's own (``POSTGRES_*``, ``POSTGRES_SCHEMA``, ``CREATE_TABLE``, ``ORIGINATOR_ID_TYPE``,
``SINGLE_ROW_TRACKING``, per-application table names ``<app>_events``, ``<app>_snapshots``,
``<app>_tracking``), and so are its exception types.

Modules: ``factory`` (the infrastructure factory eventsourcing finds here), ``recorders``
(application, process, tracking and snapshot recorders, on the tables ``infrastructure/store/schema.py``
defines for the store too), ``errors`` (the one exception type of ours, an eventsourcing ``IntegrityError``).
"""

from commitline.eventsourcing.errors import IdempotencyKeyUsed
from commitline.eventsourcing.factory import CommitlineFactory
from commitline.eventsourcing.recorders import (
    CommitlineAggregateRecorder,
    CommitlineApplicationRecorder,
    CommitlineProcessRecorder,
    CommitlineTrackingRecorder,
)

Factory = CommitlineFactory

__all__ = [
    "CommitlineAggregateRecorder", "CommitlineApplicationRecorder", "CommitlineFactory", "CommitlineProcessRecorder",
    "CommitlineTrackingRecorder", "Factory", "IdempotencyKeyUsed",
]
