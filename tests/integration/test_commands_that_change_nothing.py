"""A command whose decision is "nothing to change" is applied exactly once like any other: its key is recorded
with no events, its answer names the stream's version as read, and deciding it on a stale cached copy cannot
happen (no append would notice the copy was stale), on a real store."""

from __future__ import annotations

import threading
from uuid import uuid4

import psycopg
import pytest

from commitline import AggregateNotFound, IdempotencyKeyReused
from commitline.composition import bootstrap
from tests.domains import quiet
from tests.support import settings_for


def counts(pg_dsn: str, schema: str) -> tuple[int, int]:
    with psycopg.connect(pg_dsn) as conn:
        events = conn.execute(f'SELECT count(*) FROM "{schema}".events').fetchone()[0]
        keys = conn.execute(f'SELECT count(*) FROM "{schema}".idempotency_keys').fetchone()[0]
    return events, keys


def switch(lamp: str, on: bool) -> dict[str, object]:
    return {"type": "switch", "lamp_id": lamp, "on": on}


def test_a_command_that_changes_nothing_records_its_key_and_replays_its_answer(pg_dsn: str, schema: str) -> None:
    lamp = str(uuid4())
    with bootstrap(settings_for(pg_dsn, schema), domain=quiet.domain) as app:
        app.dispatch(switch(lamp, True), idempotency_key="on")
        before = counts(pg_dsn, schema)
        first = app.dispatch(switch(lamp, True), idempotency_key="on-again")
        assert (first.events, first.version, first.replayed) == ((), 1, False)
        assert first.aggregate_type == "Lamp"
        assert counts(pg_dsn, schema) == (before[0], before[1] + 1), "no event, one key"
        again = app.dispatch(switch(lamp, True), idempotency_key="on-again")
        assert (again.events, again.version, again.replayed) == ((), 1, True)
        assert again.aggregate_type == "Lamp" and again.aggregate_id == first.aggregate_id
        with pytest.raises(IdempotencyKeyReused):
            app.dispatch(switch(lamp, False), idempotency_key="on-again")
        assert counts(pg_dsn, schema) == (before[0], before[1] + 1)


def test_on_a_new_id_it_answers_version_zero_and_starts_no_stream(pg_dsn: str, schema: str) -> None:
    lamp = str(uuid4())
    with bootstrap(settings_for(pg_dsn, schema), domain=quiet.domain) as app:
        answer = app.dispatch(switch(lamp, False), idempotency_key="off")
        assert (answer.events, answer.version) == ((), 0)
        assert counts(pg_dsn, schema)[0] == 0
        later = app.dispatch(switch(lamp, True), idempotency_key="on")  # the stream starts at version 1
        assert [e.version for e in later.events] == [1]


def test_it_is_decided_on_the_stored_stream_not_on_a_stale_cached_copy(pg_dsn: str, schema: str) -> None:
    lamp = str(uuid4())
    with bootstrap(settings_for(pg_dsn, schema), domain=quiet.domain) as first, \
            bootstrap(settings_for(pg_dsn, schema), domain=quiet.domain) as second:
        first.dispatch(switch(lamp, True), idempotency_key="on-1")  # ``first`` caches the lamp as on
        second.dispatch(switch(lamp, False), idempotency_key="off")  # another process switches it off
        answer = first.dispatch(switch(lamp, True), idempotency_key="on-2")
        assert [(e.version, e.payload["on"]) for e in answer.events] == [(3, True)], \
            "the cached copy said 'already on'; the stored lamp is off"
        unchanged = first.dispatch(switch(lamp, True), idempotency_key="on-3")
        assert (unchanged.events, unchanged.version) == ((), 3)


def test_twins_racing_with_one_key_get_one_answer_and_record_one_key(pg_dsn: str, schema: str) -> None:
    lamp, racers = str(uuid4()), 16
    with bootstrap(settings_for(pg_dsn, schema), domain=quiet.domain) as app:
        app.dispatch(switch(lamp, True), idempotency_key="on")
        before = counts(pg_dsn, schema)
        start, answers, errors = threading.Barrier(racers), [], []

        def race() -> None:
            start.wait()
            try:
                answers.append(app.dispatch(switch(lamp, True), idempotency_key="twin"))
            except BaseException as e:  # asserted below
                errors.append(e)

        threads = [threading.Thread(target=race) for _ in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and len(answers) == racers
        assert sum(not a.replayed for a in answers) == 1
        assert {(a.events, a.version, a.aggregate_type) for a in answers} == {((), 1, "Lamp")}
        assert counts(pg_dsn, schema) == (before[0], before[1] + 1)


def test_another_tenants_lamp_is_not_found_and_nothing_is_recorded(pg_dsn: str, schema: str) -> None:
    lamp = str(uuid4())
    with bootstrap(settings_for(pg_dsn, schema), domain=quiet.domain) as app:
        app.dispatch(switch(lamp, True), idempotency_key="on", tenant="acme")
        before = counts(pg_dsn, schema)
        with pytest.raises(AggregateNotFound):
            app.dispatch(switch(lamp, False), idempotency_key="off", tenant="globex")  # would change nothing
        assert counts(pg_dsn, schema) == before
