"""The notification listeners (erasures, API key changes) say an outage once when it starts, not once per attempt
to listen again: a database down for minutes made dozens of identical warnings per process."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import pytest

from commitline.infrastructure.personal.erasure_watch import ErasureWatch
from commitline.infrastructure.store.api_key_cache import ChangeFeed
from tests.support import wait_for


def nowhere() -> dict[str, Any]:
    """libpq parameters of a server that refuses every connection at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"host": "127.0.0.1", "port": port, "dbname": "test", "user": "postgres", "connect_timeout": 2}


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage())


def test_the_erasure_listener_warns_once_however_many_attempts_fail(caplog: pytest.LogCaptureFixture) -> None:
    attempts = []
    watch = ErasureWatch(nowhere(), "c", forget=lambda ids: None, forget_all=lambda: attempts.append(1))
    with caplog.at_level(logging.WARNING):
        watch.start()
        try:
            wait_for(lambda: len(attempts) >= 3, "three failed attempts to listen", timeout=60)
        finally:
            watch.close(wait_s=5)
    assert warnings(caplog, "erasure notifications (LISTEN c) interrupted") == 1, caplog.text


def test_the_api_key_listener_warns_once_however_many_attempts_fail(caplog: pytest.LogCaptureFixture) -> None:
    feed, lock = ChangeFeed(nowhere(), "c"), threading.Lock()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            feed._retry_at = 0.0  # the next poll tries again now, not after RETRY_S
            with lock:
                feed.poll(lock)
    assert feed.connections == 0
    assert warnings(caplog, "cannot listen for API key changes (LISTEN c)") == 1, caplog.text
