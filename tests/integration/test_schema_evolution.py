"""Schema evolution: a store holding version-1 events of a class that ships at version 2 with its upcaster.
Loading, the audit (its chain covers the stored bytes, which never change), a projection rebuild and Kafka
all see version 2; a release that cannot read what the store holds is refused at start, naming the class and
the version."""

from __future__ import annotations

from uuid import uuid4

import psycopg
import pytest

from commitline import InvalidDomain
from commitline.composition import bootstrap
from tests.domains.evolution import v1, v2, v3_broken
from tests.integration.test_partitioned_publishing import consume_everything
from tests.support import count_rows, kafka_settings, settings_for


def test_version_1_events_are_read_as_version_2_everywhere(pg_dsn: str, schema: str, kafka_bootstrap: str) -> None:
    notebook = uuid4()
    with bootstrap(settings_for(pg_dsn, schema), domain=v1.domain) as old:
        old.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "Groceries\nmilk, eggs"},
                     idempotency_key="n-1")
        old.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "Call the bank"},
                     idempotency_key="n-2")
    with psycopg.connect(pg_dsn) as conn:
        stored_before = conn.execute(f"SELECT state FROM {schema}.events ORDER BY notification_id").fetchall()

    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap)
    with bootstrap(settings, domain=v2.domain) as app:
        # loading: the aggregate replays the upcast events
        assert app.load(v2.Notebook, notebook).titles == ["Groceries", "Call the bank"]
        app.dispatch({"type": "write_note", "notebook_id": str(notebook), "title": "Plan", "body": "b"},
                     idempotency_key="n-3")
        # the audit: history in version 2, and every chain verifies (the stored bytes never changed)
        history = app.auditor().history(notebook)
        assert [e.payload for e in history.entries] == [{"title": "Groceries", "body": "milk, eggs"},
                                                        {"title": "Call the bank", "body": ""},
                                                        {"title": "Plan", "body": "b"}]
        assert app.auditor().verify().ok
        with psycopg.connect(pg_dsn) as conn:
            stored_after = conn.execute(f"SELECT state FROM {schema}.events ORDER BY notification_id").fetchall()
        assert stored_after[:2] == stored_before, "history is never rewritten"
        # a projection rebuild reads version 2
        app.rebuild("titles")
        with psycopg.connect(pg_dsn) as conn:
            titles = conn.execute(f"SELECT title FROM {schema}.rm_titles ORDER BY version").fetchall()
        assert [t for (t,) in titles] == ["Groceries", "Call the bank", "Plan"]
        # Kafka: each record carries the payload in version 2 and says so
        with app.background(app.publisher) as (publisher,):
            publisher.wait_until_at(app.status().head)
    records = consume_everything(kafka_bootstrap, settings.kafka_topic_prefix, [v2.Notebook])
    envelopes = [r[3] for r in records]
    assert [(e["schema_version"], e["payload"]) for e in envelopes] == [
        (2, {"title": "Groceries", "body": "milk, eggs"}), (2, {"title": "Call the bank", "body": ""}),
        (2, {"title": "Plan", "body": "b"})]


def test_a_release_that_cannot_read_the_stored_versions_is_refused_at_start(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema), domain=v1.domain) as old:
        old.dispatch({"type": "write_note", "notebook_id": str(uuid4()), "text": "t"}, idempotency_key="n-1")
    rows = count_rows(pg_dsn, schema)
    with pytest.raises(InvalidDomain) as refused:
        bootstrap(settings_for(pg_dsn, schema), domain=v3_broken.domain)
    (problem,) = refused.value.problems
    assert f"schema {schema}: holds NoteWritten events at version 1" in problem
    assert "lacks upcast_v1_v2" in problem and "tests/domains/evolution/v3_broken.py:" in problem
    # a store written by a newer release is refused by an older one, and one of another domain's types too
    with bootstrap(settings_for(pg_dsn, schema), domain=v2.domain) as new:
        new.dispatch({"type": "write_note", "notebook_id": str(uuid4()), "title": "t"}, idempotency_key="n-2")
    with pytest.raises(InvalidDomain, match="holds NoteWritten events at version 2, newer than its class_version 1"):
        bootstrap(settings_for(pg_dsn, schema), domain=v1.domain)
    from tests.trades import domain as trades

    with pytest.raises(InvalidDomain, match="holds NoteWritten events .* a type the domain 'trades' does not declare"):
        bootstrap(settings_for(pg_dsn, schema), domain=trades)
    assert count_rows(pg_dsn, schema)["events"] == rows["events"] + 1, "refused before writing anything"


def test_a_running_older_release_refuses_an_event_a_newer_one_wrote(pg_dsn: str, schema: str) -> None:
    from commitline import ConfigurationError

    notebook = uuid4()
    with bootstrap(settings_for(pg_dsn, schema), domain=v1.domain) as old:
        old.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "first"}, idempotency_key="n-1")
        with bootstrap(settings_for(pg_dsn, schema), domain=v2.domain) as new:  # started later: it reads v1
            new.dispatch({"type": "write_note", "notebook_id": str(notebook), "title": "second"},
                         idempotency_key="n-2")
        rows = count_rows(pg_dsn, schema)
        with pytest.raises(ConfigurationError, match="stored at class version 2, newer than this release's 1"):
            old.load(v1.Notebook, notebook)
        with pytest.raises(ConfigurationError, match="newer than this release's 1"):
            old.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "third"},
                         idempotency_key="n-3")
        assert count_rows(pg_dsn, schema) == rows, "nothing written on a stream it cannot read"


def test_the_cli_refuses_a_store_it_cannot_read_naming_the_app(pg_dsn: str, schema: str) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    with bootstrap(settings_for(pg_dsn, schema), domain=v2.domain) as new:
        new.dispatch({"type": "write_note", "notebook_id": str(uuid4()), "title": "t"}, idempotency_key="n-1")
    done = subprocess.run([sys.executable, "-m", "commitline.cli", "--app", "tests.domains.evolution.v1:domain",
                           "status"], cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema})
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert done.stderr.startswith("commitline: --app 'tests.domains.evolution.v1:domain': domain 'notes' cannot be "
                                  "used: 1 problem:"), done.stderr
    assert "holds NoteWritten events at version 2, newer than its class_version 1" in done.stderr
