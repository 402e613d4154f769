"""A read model whose rows cannot be written (a note of letters into a ``bigint`` column) stops at the event that
made them, as at a handler's error: the events before it are in its tables, the error and the event's position
are recorded for ``status``, the projection waits for ``projections retry`` or ``skip``, and the other read
models of the same ``commitline project`` process go on. Real PostgreSQL, a real ``project`` process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from uuid import uuid4

import psycopg

from commitline.composition import bootstrap
from tests.domains import unwritable
from tests.support import settings_for, wait_for

APP = "tests.domains.unwritable:domain"


def rows(pg_dsn: str, schema: str, sql: str) -> list[tuple]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(sql.format(schema=f'"{schema}"')).fetchall()


def test_an_event_whose_rows_cannot_be_written_is_a_poison_event_of_its_read_model_alone(pg_dsn: str,
                                                                                       schema: str) -> None:
    pad = uuid4()
    with bootstrap(settings_for(pg_dsn, schema), domain=unwritable.domain) as app:
        for n, text in enumerate(("1", "2", "three", "4", "5")):
            app.dispatch({"type": "note", "pad_id": str(pad), "note": text}, idempotency_key=f"note-{n}")
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema, "COMMITLINE_APP": APP}
    project = subprocess.Popen([sys.executable, "-m", "commitline.cli", "project"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def stopped() -> dict | None:
            found = rows(pg_dsn, schema, "SELECT status, position, error FROM {schema}.follower_positions "
                                         "WHERE name = 'notes'")
            return found[0] if found and found[0][0] == "failed" else None

        status, position, error = wait_for(stopped, "the notes read model to stop at the third event")
        assert position == 2 and error["position"] == 3 and error["event_type"] == "Noted", error
        assert "invalid input syntax for type bigint" in error["message"], error
        assert sorted(n for (n,) in rows(pg_dsn, schema, "SELECT number FROM {schema}.rm_notes")) == [1, 2]
        wait_for(lambda: rows(pg_dsn, schema, "SELECT notes FROM {schema}.rm_note_counts") == [(5,)],
                 "the other read model of the process to go on to the fifth event")
        assert project.poll() is None, "the project process keeps running"

        skipped = subprocess.run([sys.executable, "-m", "commitline.cli", "projections", "skip", "notes",
                                  "--position", "3", "--reason", "a note of letters"], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert skipped.returncode == 0, skipped.stderr
        wait_for(lambda: sorted(n for (n,) in rows(pg_dsn, schema, "SELECT number FROM {schema}.rm_notes")) ==
                 [1, 2, 4, 5], "the notes after the skipped one")
    finally:
        project.send_signal(signal.SIGTERM)
        _, stderr = project.communicate(timeout=120)
    assert "Traceback" not in stderr, stderr[-3000:]
