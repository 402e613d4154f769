"""eventsourcing's own test cases, imported from the installed package and run unchanged against
``commitline.eventsourcing`` (the subclasses only say how to build the recorder or view, as the
library's PostgreSQL tests do). The environment comes from conftest.py.

Not run: ``NonInterleavingNotificationIDsBaseCase`` (without a table lock two concurrent transactions'
ids may interleave: commitline does not promise otherwise; the README says why),
``TaggedDecisionCountersProjectionTestCase`` (DCB applications need eventsourcing's DCB persistence,
which this module does not provide)."""

from __future__ import annotations

import os
from typing import Any

from eventsourcing.persistence import InfrastructureFactory, Tracking
from eventsourcing.tests.application import ApplicationTestCase, ExampleApplicationTestCase
from eventsourcing.tests.persistence import (
    ApplicationRecorderTestCase,
    ProcessRecorderTestCase,
    TrackingRecorderTestCase,
)
from eventsourcing.tests.projection import (
    AggregateEventCountersProjectionTestCase,
    EventCountersView,
    EventCountersViewTestCase,
    EventSourcedProjectionTestCase,
)
from eventsourcing.utils import Environment
from psycopg.sql import SQL, Identifier

from commitline.eventsourcing import (
    CommitlineApplicationRecorder,
    CommitlineFactory,
    CommitlineProcessRecorder,
    CommitlineTrackingRecorder,
)


class _FromEnvironment:
    """Builds recorders with the factory ``PERSISTENCE_MODULE`` names, closed after the test."""

    def factory(self) -> Any:
        factory = InfrastructureFactory.construct(Environment(env=dict(os.environ)))
        assert isinstance(factory, CommitlineFactory)
        self.addCleanup(factory.close)  # type: ignore[attr-defined]
        return factory


class TestApplicationRecorder(_FromEnvironment, ApplicationRecorderTestCase[CommitlineApplicationRecorder]):
    def create_recorder(self) -> CommitlineApplicationRecorder:
        recorder = self.factory().application_recorder()
        assert isinstance(recorder, CommitlineApplicationRecorder)
        return recorder

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


class TestTrackingRecorder(_FromEnvironment, TrackingRecorderTestCase):
    def create_recorder(self) -> CommitlineTrackingRecorder:
        return self.factory().tracking_recorder()


class TestProcessRecorder(_FromEnvironment, ProcessRecorderTestCase):
    def create_recorder(self) -> CommitlineProcessRecorder:
        recorder = self.factory().process_recorder()
        assert isinstance(recorder, CommitlineProcessRecorder)
        return recorder


class TestApplication(ApplicationTestCase):
    pass


class TestExampleApplication(ExampleApplicationTestCase):
    expected_factory_topic = "commitline.eventsourcing.factory:CommitlineFactory"


class EventCounters(CommitlineTrackingRecorder, EventCountersView):
    """The counters view of eventsourcing's projection tests, on this module's tracking recorder
    (what the library's PostgreSQL tests define as PostgresEventCounters)."""

    def __init__(self, datastore: Any, **kwargs: Any):
        super().__init__(datastore, **kwargs)
        table = Identifier(self.datastore.schema, self.tracking_table_name.replace("_tracking", "") + "_counters")
        self.sql_create_statements.append(
            SQL("CREATE TABLE IF NOT EXISTS {} (counter_name text PRIMARY KEY, counter bigint)").format(table))
        self._select = SQL("SELECT counter FROM {} WHERE counter_name = %s").format(table)
        self._incr = SQL("INSERT INTO {0} VALUES (%s, 1) ON CONFLICT (counter_name) "
                         "DO UPDATE SET counter = {0}.counter + 1").format(table)

    def get_created_event_counter(self) -> int:
        return self._counter("created")

    def get_subsequent_event_counter(self) -> int:
        return self._counter("subsequent")

    def incr_created_event_counter(self, tracking: Tracking) -> None:
        self._increment("created", tracking)

    def incr_subsequent_event_counter(self, tracking: Tracking) -> None:
        self._increment("subsequent", tracking)

    def _counter(self, name: str) -> int:
        with self.datastore.transaction(commit=False) as curs:
            row = curs.execute(self._select, (name,)).fetchone()
            return row["counter"] if row else 0

    def _increment(self, name: str, tracking: Tracking) -> None:
        with self.datastore.transaction(commit=True) as curs:
            self._insert_tracking(curs, tracking)
            curs.execute(self._incr, (name,))


class TestEventCountersView(_FromEnvironment, EventCountersViewTestCase):
    def construct_event_counters_view(self) -> EventCountersView:
        return self.factory().tracking_recorder(EventCounters)


class TestAggregateEventCountersProjection(AggregateEventCountersProjectionTestCase):
    view_class = EventCounters


class TestEventSourcedProjection(EventSourcedProjectionTestCase):
    pass


del ApplicationRecorderTestCase, TrackingRecorderTestCase, ProcessRecorderTestCase, ApplicationTestCase
del ExampleApplicationTestCase, EventCountersViewTestCase, AggregateEventCountersProjectionTestCase
del EventSourcedProjectionTestCase
