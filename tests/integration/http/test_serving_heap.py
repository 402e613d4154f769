"""A serving process keeps what it made at start-up out of the collector's full collections
(``http.app.freeze_startup_heap``): otherwise each one scans the whole application with the interpreter lock
held while every request in flight waits. Checked on a ``commitline serve`` worker's own start-up
(``app_from_environment`` and its lifespan, bootstrapping from the environment against a real PostgreSQL)."""

from __future__ import annotations

import gc

import pytest

from commitline.composition import Commitline
from commitline.http.app import app_from_environment


def _tracked(obj: object) -> bool:
    """Whether the collector's generations (what a full collection scans) hold ``obj``."""
    return any(o is obj for o in gc.get_objects())


async def test_a_serve_worker_freezes_its_start_up_objects_out_of_full_collections(
        app: Commitline, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMITLINE_DATABASE_URL", pg_dsn)
    monkeypatch.setenv("COMMITLINE_SCHEMA", schema)  # migrated by ``app``: a worker does not migrate
    monkeypatch.setenv("COMMITLINE_DISPATCH_CPU", "off")  # this test's thread stays where it is
    frozen_before = gc.get_freeze_count()
    gc.unfreeze()  # what other tests' followers froze: this test sees only the worker's own freezing
    try:
        worker = app_from_environment()
        assert _tracked(worker.router), "the worker's routes are scanned by full collections before it starts"
        async with worker.router.lifespan_context(worker):
            assert worker.state.commitline is not None  # bootstrapped from the environment
            assert not _tracked(worker.router), "the worker's routes are still scanned by every full collection"
            assert not _tracked(worker.state.commitline), "the worker's Commitline is still scanned"
            assert gc.get_freeze_count() > 0
    finally:
        if frozen_before:
            gc.freeze()
        else:
            gc.unfreeze()
