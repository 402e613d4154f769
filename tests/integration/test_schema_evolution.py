"""Schema evolution: a store holding version-1 events of a class that ships at version 2 with its upcaster.
Loading, the audit (its chain covers the stored bytes, which never change), a projection rebuild and Kafka
all see version 2; a release that cannot read what the store holds is refused at start, naming the class and
the version."""

from __future__ import annotations

from uuid import uuid4

import psycopg
import pytest

from commitline import InvalidDomain
from commitline.application.errors import ConfigurationError
from commitline.composition import bootstrap
from tests.domains.evolution import v1, v1_field_added, v2, v3_broken
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



def test_a_snapshot_an_older_release_took_is_not_used_by_a_newer_one(pg_dsn: str, schema: str) -> None:
    """The same events fold into another state in release 2 (its notebook keeps titles; release 1's kept the
    notes), so release 1's snapshot would hand release 2 a notebook without its titles. Release 2 passes it over:
    it replays the stream from its first event, on the command path and on a load, and takes a snapshot of its
    own, which the next process starts from."""
    notebook = uuid4()
    settings = settings_for(pg_dsn, schema, snapshot_interval=10)
    with bootstrap(settings, domain=v1.domain) as old:
        for i in range(12):
            old.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": f"Note {i}\nbody"},
                         idempotency_key=f"n-{i}")
        assert old.store.flush_snapshots(60)
    with psycopg.connect(pg_dsn) as conn:
        ((version, taken_by_1),) = conn.execute(f"SELECT version, aggregate_type FROM {schema}.snapshots").fetchall()
    assert version == 10 and taken_by_1.startswith("Notebook/")

    titles = [*(f"Note {i}" for i in range(12)), "Plan"]
    with bootstrap(settings, domain=v2.domain) as new:  # nothing cached: the command reads the snapshot first
        assert new.dispatch({"type": "write_note", "notebook_id": str(notebook), "title": "Plan"},
                            idempotency_key="n-12").version == 13
        assert new.store.load(v2.Notebook, notebook).titles == titles
        assert new.store.flush_snapshots(60)
    with psycopg.connect(pg_dsn) as conn:
        ((version, taken_by_2),) = conn.execute(f"SELECT version, aggregate_type FROM {schema}.snapshots").fetchall()
    assert version >= 12 and taken_by_2.startswith("Notebook/") and taken_by_2 != taken_by_1
    with bootstrap(settings, domain=v2.domain) as later:
        snapshot, _, _ = later.recorder.load_stream(notebook, after_snapshot=True)
        assert snapshot is not None and snapshot.aggregate_type == taken_by_2
        assert later.store.load(v2.Notebook, notebook).titles == titles


def test_an_event_field_added_without_a_default_or_an_upcaster_is_named_when_a_stored_event_lacks_it(
        pg_dsn: str, schema: str) -> None:
    """The stored version-1 notes have no ``pinned``: reading them with a class that requires it fails with a
    typed error naming the event, the field and the two ways out, not a validation traceback."""
    notebook = uuid4()
    with bootstrap(settings_for(pg_dsn, schema), domain=v1.domain) as old:
        old.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "t"}, idempotency_key="n-1")
    with bootstrap(settings_for(pg_dsn, schema), domain=v1_field_added.domain) as new:
        for attempt in (lambda: new.load(v1_field_added.Notebook, notebook),
                        lambda: new.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "u"},
                                             idempotency_key="n-2")):
            with pytest.raises(ConfigurationError) as refused:
                attempt()
            message = str(refused.value)
            assert message.startswith(f"the domain: the NoteWritten event at version 1 of stream {notebook}, stored "
                                      "at class_version 1, does not fit "), message
            assert "tests.domains.evolution.v1_field_added.NoteWritten" in message
            assert "pinned: Field required" in message and "needs a default" in message
            assert "upcast_v1_v2" in message
    assert count_rows(pg_dsn, schema)["events"] == 1

def test_a_retry_sent_before_its_command_gained_an_optional_field_replays_after_the_deploy(
        pg_dsn: str, schema: str) -> None:
    """A request is the same request to the release after a field with a default was added to its command: its
    retry replays the first answer (the field left out, or sent at its default), and only a request that sets the
    field otherwise is another request. A record from before fingerprints left defaults out still replays."""
    from commitline.application.dispatching import full_fingerprint
    from commitline.application.errors import IdempotencyKeyReused
    from tests.domains.evolution import v1_command_option

    notebook = uuid4()
    sent = {"type": "write_note", "notebook_id": str(notebook), "text": "Groceries"}
    with bootstrap(settings_for(pg_dsn, schema), domain=v1.domain) as old:
        first = old.dispatch(sent, idempotency_key="n-1")
        old.dispatch({**sent, "text": "Bank"}, idempotency_key="n-2")
    with psycopg.connect(pg_dsn) as conn:  # n-2 as a release before this change recorded it: every field
        conn.execute(f"UPDATE {schema}.idempotency_keys SET fingerprint = %s WHERE key = 'n-2'",
                     (full_fingerprint(v1.WriteNote(notebook_id=notebook, text="Bank"))[:16],))
    rows = count_rows(pg_dsn, schema)
    with bootstrap(settings_for(pg_dsn, schema), domain=v1_command_option.domain) as new:
        for retry in (sent, {**sent, "pinned": False}):
            again = new.dispatch(retry, idempotency_key="n-1")
            assert again.replayed and (again.aggregate_id, again.version) == (first.aggregate_id, first.version)
        assert new.dispatch({**sent, "text": "Bank"}, idempotency_key="n-2").replayed
        with pytest.raises(IdempotencyKeyReused) as refused:
            new.dispatch({**sent, "pinned": True}, idempotency_key="n-1")
        assert str(refused.value).endswith("was already used for a different write_note request")
        with pytest.raises(IdempotencyKeyReused):
            new.dispatch({**sent, "text": "Other"}, idempotency_key="n-1")
    assert count_rows(pg_dsn, schema) == rows


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


def test_an_event_field_renamed_with_a_default_is_refused_rather_than_read_as_the_default(
        pg_dsn: str, schema: str) -> None:
    """``text`` renamed ``body`` with a default and no upcaster: the stored notes hold ``text`` and lack ``body``.
    Read as they are they would load as empty notes (the stored text dropped without a word); they are refused,
    naming both fields and the upcaster to write, and nothing is written on the stream."""
    from tests.domains.evolution import v1_field_renamed

    notebook = uuid4()
    with bootstrap(settings_for(pg_dsn, schema), domain=v1.domain) as old:
        old.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "Groceries"}, idempotency_key="n-1")
    with bootstrap(settings_for(pg_dsn, schema), domain=v1_field_renamed.domain) as new:
        for attempt in (lambda: new.load(v1_field_renamed.Notebook, notebook),
                        lambda: new.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "u"},
                                             idempotency_key="n-2"),
                        lambda: new.auditor().history(notebook)):
            with pytest.raises(ConfigurationError) as refused:
                attempt()
            message = str(refused.value)
            assert message.startswith(f"the domain: the NoteWritten event at version 1 of stream {notebook}, stored "
                                      "at class_version 1, holds text, which tests.domains.evolution."
                                      "v1_field_renamed.NoteWritten (class_version 1) does not declare, and lacks "
                                      "its body"), message
            assert "upcast_v1_v2" in message
    assert count_rows(pg_dsn, schema)["events"] == 1
    # the same events read by release 2, whose upcaster moves the field
    with bootstrap(settings_for(pg_dsn, schema), domain=v2.domain) as upcast:
        assert upcast.load(v2.Notebook, notebook).titles == ["Groceries"]


def test_a_request_sent_again_byte_for_byte_replays_after_its_field_s_default_changed(
        pg_dsn: str, schema: str) -> None:
    """Two requests set ``pinned`` explicitly, one at the default of the time and one not; the next release flips
    the default. Each sent again as it was is the same request (the fingerprint holds the fields as sent), while
    leaving ``pinned`` out now means the new default: for the request that set it False, another request."""
    from commitline.application.errors import IdempotencyKeyReused
    from tests.domains.evolution import v1_command_default_changed, v1_command_option

    notebook = uuid4()
    at_default = {"type": "write_note", "notebook_id": str(notebook), "text": "a", "pinned": False}
    off_default = {"type": "write_note", "notebook_id": str(notebook), "text": "b", "pinned": True}
    with bootstrap(settings_for(pg_dsn, schema), domain=v1_command_option.domain) as old:
        first = {key: old.dispatch(sent, idempotency_key=key)
                 for key, sent in (("d-1", at_default), ("d-2", off_default))}
    rows = count_rows(pg_dsn, schema)
    with bootstrap(settings_for(pg_dsn, schema), domain=v1_command_default_changed.domain) as new:
        for key, sent in (("d-1", at_default), ("d-2", off_default)):
            again = new.dispatch(sent, idempotency_key=key)
            assert again.replayed and again.version == first[key].version, key
        left_out = {k: v for k, v in at_default.items() if k != "pinned"}  # pinned=True now: not what d-1 was
        with pytest.raises(IdempotencyKeyReused):
            new.dispatch(left_out, idempotency_key="d-1")
    assert count_rows(pg_dsn, schema) == rows


def test_a_read_model_of_the_older_release_waits_for_the_newer_one_instead_of_poisoning_its_event(
        pg_dsn: str, schema: str) -> None:
    """A rolling upgrade: release 2 writes a NoteWritten at class_version 2 while release 1's projector still runs.
    Release 1 cannot read it; that is no defect of the event, so it is not recorded as poison (which would stop
    the read model until an operator's ``projections retry``): the projector retries it, its status ``retrying``
    with the error, and release 2's projector, once it takes over, goes on from there by itself."""
    from commitline.infrastructure.followers.thread import FollowerThread
    from tests.support import wait_for

    notebook = uuid4()
    with bootstrap(settings_for(pg_dsn, schema), domain=v1.domain) as old, \
            FollowerThread(lambda: old.projector("titles", poll_interval=0.2)):
        old.dispatch({"type": "write_note", "notebook_id": str(notebook), "text": "Groceries"}, idempotency_key="n-1")
        with bootstrap(settings_for(pg_dsn, schema), domain=v2.domain) as new:
            new.dispatch({"type": "write_note", "notebook_id": str(notebook), "title": "Plan"}, idempotency_key="n-2")
            head = new.recorder.max_notification_id()

        def titles_status() -> object:
            (status,) = [s for s in old.status().followers if s.name == "titles"]
            return status

        wait_for(lambda: titles_status().status == "retrying", "release 1's projector to retry the newer event")
        status = titles_status()
        assert status.error is not None and status.error["position"] == head, status.error
        assert "newer than this release's 1" in status.error["message"]
        assert status.position == head - 1, "the event before it applied, the newer one not passed"
    with bootstrap(settings_for(pg_dsn, schema), domain=v2.domain) as new, \
            FollowerThread(lambda: new.projector("titles", poll_interval=0.2)):
        wait_for(lambda: [s for s in new.status().followers if s.name == "titles"][0].position == head,
                 "release 2's projector to go on by itself")
        with psycopg.connect(pg_dsn) as conn:
            titles = conn.execute(f"SELECT title FROM {schema}.rm_titles ORDER BY version").fetchall()
        assert [t for (t,) in titles] == ["Groceries", "Plan"]
        (status,) = [s for s in new.status().followers if s.name == "titles"]
        assert status.status == "running" and status.error is None
