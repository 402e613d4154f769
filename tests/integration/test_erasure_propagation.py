"""An erasure reaches every running process at once, not when its cached data key expires: the erasing
transaction notifies the key's id, and each process holding data keys listens for it and forgets the key and
every decoded aggregate. A process whose listening connection is lost drops every key and decoded aggregate
it holds once it listens again (it may have missed notifications). Every process here keeps data keys for an
hour (``COMMITLINE_DATA_KEY_TTL_S``), so nothing below can pass by a key expiring."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import psycopg
import pytest

from commitline import ERASED
from commitline.composition import Commitline, bootstrap
from commitline.examples.payments import PaymentTransaction
from tests.integration.http.conftest import Server, start_server
from tests.support import settings_for, wait_for

pytestmark = pytest.mark.integration
ACCOUNT = "GB33BUKB20201555555555"
HOUR = 3600.0
REACH_S = 10  # far below the hour the keys are kept: only a notification can make it


def create(app: Commitline, key: str) -> UUID:
    return app.dispatch({"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": ACCOUNT},
                        idempotency_key=key).aggregate_id


def erase_from_the_command_line(pg_dsn: str, schema: str, subject: UUID) -> None:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    done = subprocess.run([sys.executable, "-m", "commitline.cli", "erase", "--tenant", "default", "--subject",
                           str(subject)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr


def listeners(pg_dsn: str, schema: str, process: int | None = None) -> list[int]:
    """The server processes of the connections listening for the schema's erasures (of ``process`` only)."""
    with psycopg.connect(pg_dsn) as conn:
        return [pid for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s AND query = %s",
            (f"commitline erasures (pid {process if process is not None else '%'})",
             f'LISTEN "{schema}_data_keys_erased"'))]


def terminate(pg_dsn: str, pid: int) -> None:
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


@pytest.fixture
def holder(pg_dsn: str, schema: str) -> Iterator[Commitline]:
    """A second running process (its own store, caches and listener) that keeps data keys for an hour."""
    with bootstrap(settings_for(pg_dsn, schema, data_key_ttl_s=HOUR)) as app:
        yield app


@pytest.fixture
def server(pg_dsn: str, schema: str, tmp_path: Path) -> Iterator[Server]:
    running = start_server(pg_dsn, schema, tmp_path / "serve.log", COMMITLINE_DATA_KEY_TTL_S=str(HOUR))
    yield running
    running.stop()


def account_served(server: Server, pid: UUID) -> object:
    with server.client("default") as client:
        answer = client.get(f"/v1/aggregates/{pid}")
    assert answer.status_code == 200, answer.text
    return answer.json()["state"]["account"]


def test_an_erasure_reaches_a_running_server_at_once(app: Commitline, server: Server, pg_dsn: str,
                                                     schema: str) -> None:
    pid = create(app, "create")
    assert account_served(server, pid) == ACCOUNT  # the server holds the subject's key now, for an hour
    wait_for(lambda: listeners(pg_dsn, schema, server.process.pid), "the server to listen for erasures",
                           timeout=60)

    erase_from_the_command_line(pg_dsn, schema, pid)
    wait_for(lambda: account_served(server, pid) == {"erased": True}, "the server to read the account as erased",
             timeout=REACH_S)


def test_a_server_that_lost_its_listening_connection_drops_every_key_it_held(app: Commitline, server: Server,
                                                                              pg_dsn: str, schema: str) -> None:
    pid = create(app, "create")
    assert account_served(server, pid) == ACCOUNT
    (listening,) = wait_for(lambda: listeners(pg_dsn, schema, server.process.pid), "the server to listen for erasures",
                           timeout=60)
    with psycopg.connect(pg_dsn) as conn:  # an erasure whose notification never reaches the server
        conn.execute(f'DELETE FROM "{schema}".data_keys WHERE subject = %s', (str(pid),))
    assert account_served(server, pid) == ACCOUNT  # its key is still held: nothing told the server

    terminate(pg_dsn, listening)
    wait_for(lambda: account_served(server, pid) == {"erased": True}, "the server to drop the keys it held",
             timeout=REACH_S)
    wait_for(lambda: listeners(pg_dsn, schema, server.process.pid) not in ([], [listening]),
             "the server to listen again", timeout=60)
    assert "listening again" in server.output()


def test_another_process_forgets_the_key_and_its_decoded_aggregates(holder: Commitline, app: Commitline,
                                                                     pg_dsn: str, schema: str) -> None:
    pid, other = create(holder, "create"), create(holder, "other")  # the first data key starts its listener
    assert len(holder.store.cache) == 2 and holder.codec.personal.held() == 2
    watch = holder.codec.personal.watch
    assert watch.listening.is_set()  # before the first key was held

    erase_from_the_command_line(pg_dsn, schema, pid)
    wait_for(lambda: len(holder.store.cache) == 0, "the holder to drop its decoded aggregates", timeout=REACH_S)
    assert holder.load(PaymentTransaction, pid).account is ERASED
    assert holder.load(PaymentTransaction, other).account == ACCOUNT
    done = holder.dispatch({"type": "submit_payment", "payment_id": str(pid)}, idempotency_key="submit")
    assert done.version == 2 and watch.connections == 1  # by notification: the connection was never lost


def test_after_a_lost_connection_every_key_and_aggregate_held_is_dropped(holder: Commitline, pg_dsn: str,
                                                                          schema: str) -> None:
    pid, another = create(holder, "create"), create(holder, "another")
    watch = holder.codec.personal.watch
    assert holder.codec.personal.held() == 2 and len(holder.store.cache) == 2 and watch.listening.is_set()
    first = watch.connections

    terminate(pg_dsn, watch.backend_pid)
    wait_for(lambda: watch.connections > first and watch.listening.is_set(), "the holder to listen again",
             timeout=60)
    assert holder.codec.personal.held() == 0 and len(holder.store.cache) == 0
    assert holder.load(PaymentTransaction, pid).account == ACCOUNT  # read again: the key still exists
    assert holder.dispatch({"type": "submit_payment", "payment_id": str(another)},
                           idempotency_key="submit").version == 2


def test_the_pool_losing_connections_to_the_server_makes_the_holder_listen_anew(holder: Commitline, pg_dsn: str,
                                                                                 schema: str) -> None:
    """A failover leaves the listening connection to a server that may have vanished without closing it (found
    dead only by keepalives, deaf meanwhile to erasures on the new primary): once the pool finds its own
    connections ended, the watch listens anew and drops every key it held."""
    pid = create(holder, "create")
    watch = holder.codec.personal.watch
    assert holder.codec.personal.held() == 1 and watch.listening.is_set()
    first, listening = watch.connections, watch.backend_pid
    with psycopg.connect(pg_dsn) as conn:  # an erasure nobody is told of, as one made on a new primary would be
        conn.execute(f'DELETE FROM "{schema}".data_keys WHERE subject = %s', (str(pid),))
    assert holder.load(PaymentTransaction, pid).account == ACCOUNT  # its key is still held

    holder.datastore.connections_lost += 1  # what the pool counts when it finds a connection ended by the server
    wait_for(lambda: watch.connections > first and watch.listening.is_set(), "the holder to listen anew",
             timeout=REACH_S)
    assert watch.backend_pid != listening and holder.codec.personal.held() == 0
    assert holder.load(PaymentTransaction, pid).account is ERASED
    wait_for(lambda: listeners(pg_dsn, schema, os.getpid()) == [watch.backend_pid],
             "the old listening session to end", timeout=REACH_S)  # it was closed, not left to the keepalives


def test_a_command_that_decoded_its_aggregate_before_an_erasure_does_not_cache_it(holder: Commitline) -> None:
    pid = create(holder, "create")
    store = holder.store
    encode = store.codec.encode

    def erased_meanwhile(*args: object, **kwargs: object):  # an erasure's notification lands mid-command
        store.codec.encode = encode  # type: ignore[method-assign]
        store.forget([])
        return encode(*args, **kwargs)  # type: ignore[arg-type]

    store.codec.encode = erased_meanwhile  # type: ignore[method-assign]
    done = holder.dispatch({"type": "submit_payment", "payment_id": str(pid)}, idempotency_key="submit")
    assert done.version == 2 and len(store.cache) == 0
    holder.dispatch({"type": "complete_payment", "payment_id": str(pid)}, idempotency_key="complete")
    assert len(store.cache) == 1  # decoded after the erasure: kept


def test_the_listener_starts_with_the_first_data_key_and_stops_on_close(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        app.dispatch({"type": "create_survey_task", "title": "NPS"}, idempotency_key="task")
        watch = app.codec.personal.watch
        assert not watch.running and listeners(pg_dsn, schema) == []  # no personal value: no connection
        create(app, "create")
        wait_for(lambda: listeners(pg_dsn, schema, os.getpid()), "a listening connection", timeout=60)
    wait_for(lambda: not watch.running and listeners(pg_dsn, schema) == [], "the listener to stop", timeout=60)
