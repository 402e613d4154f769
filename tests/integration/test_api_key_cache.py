"""A serving process keeps the API keys it resolved, and every change to the keys table, by any process and by
any means, reaches it through PostgreSQL's notifications: a revoked key stops working in every process without a
restart. Two bootstrapped apps on one schema stand for two processes (the serving one and an operator's)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from commitline import bootstrap
from commitline.composition import Commitline
from tests.support import settings_for, wait_for


@pytest.fixture
def served(pg_dsn: str, schema: str) -> Iterator[Commitline]:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        yield app


@pytest.fixture
def operator(pg_dsn: str, schema: str, served: Commitline) -> Iterator[Commitline]:
    with bootstrap(settings_for(pg_dsn, schema, api_key_cache_s=0)) as app:
        yield app


def test_a_resolved_key_is_read_once_then_answered_from_the_cache(served: Commitline, operator: Commitline) -> None:
    made = operator.api_keys().add("acme")
    keys = served.api_keys()
    assert keys.cache is not None
    first = keys.resolve(made.secret)
    assert first is not None and first.tenant == "acme" and first.key_id == made.key.key_id
    reads = keys.cache.reads
    assert all(keys.resolve(made.secret) == first for _ in range(20))
    assert keys.cache.reads == reads


def test_a_revocation_by_another_process_is_refused_without_a_restart(served: Commitline,
                                                                       operator: Commitline) -> None:
    kept, revoked = operator.api_keys().add("acme"), operator.api_keys().add("acme")
    keys = served.api_keys()
    assert keys.resolve(kept.secret) is not None and keys.resolve(revoked.secret) is not None
    operator.api_keys().revoke("acme", revoked.key.key_id)
    # PostgreSQL passes the notification on as the revocation commits: within moments, never a cache's lifetime
    wait_for(lambda: keys.resolve(revoked.secret) is None, "the revoked key to be refused", timeout=5)
    assert keys.resolve(kept.secret) is not None  # the tenant's other key still works


def test_a_revocation_through_the_serving_process_is_refused_on_its_very_next_resolve(served: Commitline) -> None:
    made = served.api_keys().add("acme")
    keys = served.api_keys()
    for _ in range(3):
        assert keys.resolve(made.secret) is not None
    keys.revoke("acme")
    assert keys.resolve(made.secret) is None  # no waiting: its own notification may still be on its way


@pytest.mark.parametrize("change", [
    "UPDATE {t} SET revoked_at = now() WHERE key_id = %s",
    "DELETE FROM {t} WHERE key_id = %s",
    "TRUNCATE {t}",
])
def test_a_change_made_by_hand_in_sql_is_heard_too(served: Commitline, operator: Commitline, pg_dsn: str,
                                                   schema: str, change: str) -> None:
    made = operator.api_keys().add("acme")
    keys = served.api_keys()
    assert keys.resolve(made.secret) is not None
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        params = (made.key.key_id,) if "%s" in change else None
        conn.execute(change.format(t=f'"{schema}".api_keys'), params)  # type: ignore[arg-type]
    wait_for(lambda: keys.resolve(made.secret) is None, "the changed key to be refused", timeout=5)


def test_a_lost_listening_connection_stops_the_cache_until_it_listens_again(served: Commitline,
                                                                           operator: Commitline, pg_dsn: str,
                                                                           schema: str) -> None:
    """A change nobody is told of (triggers off for that session) stands for one made while the connection was
    down: the cache keeps answering the key until it finds its connection lost, then reads it."""
    made = operator.api_keys().add("acme")
    keys = served.api_keys()
    assert keys.cache is not None and keys.resolve(made.secret) is not None
    feed = keys.cache.feed
    listening_pid, connections = feed.backend_pid, feed.connections
    assert listening_pid is not None
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # no trigger fires: no notification
        conn.execute(f'UPDATE "{schema}".api_keys SET revoked_at = now() WHERE key_id = %s', (made.key.key_id,))
        assert keys.resolve(made.secret) is not None  # unheard: the cache still answers (what listening prevents)
        conn.execute("SELECT pg_terminate_backend(%s)", (listening_pid,))
    wait_for(lambda: keys.resolve(made.secret) is None, "the key to be read again once the connection is lost",
             timeout=10)
    other = operator.api_keys().add("beta")
    wait_for(lambda: keys.resolve(other.secret) is not None and feed.connections > connections,
             "the cache to listen again on a new connection", timeout=10)
    assert feed.backend_pid not in (None, listening_pid)


def test_a_key_revoked_after_the_server_ended_the_listening_session_is_refused_at_once(
        served: Commitline, operator: Commitline, pg_dsn: str) -> None:
    """The server ending the listening session (pg_terminate_backend, a restart) leaves its last message and then
    the end of the stream on the socket; a first read takes the message without an error. The feed reads on
    until it finds the end, so the very next resolve after a revocation reads the key, not the cache."""
    made = operator.api_keys().add("acme")
    keys = served.api_keys()
    assert keys.cache is not None and keys.resolve(made.secret) is not None
    listening_pid = keys.cache.feed.backend_pid
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (listening_pid,))
        wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                      (listening_pid,)).fetchone()[0] == 0, "the listening session to end", 10)
    operator.api_keys().revoke("acme", made.key.key_id)  # notified to nobody: the session that listened is gone
    assert keys.resolve(made.secret) is None


def test_the_pool_losing_connections_to_the_server_stops_the_cache_until_it_listens_again(
        served: Commitline, operator: Commitline, pg_dsn: str, schema: str) -> None:
    """A failover leaves the listening connection to a server that may have vanished without closing it (found
    dead only by keepalives): once the pool finds its own connections ended, the feed listens anew."""
    made = operator.api_keys().add("acme")
    keys = served.api_keys()
    assert keys.cache is not None and keys.resolve(made.secret) is not None
    feed = keys.cache.feed
    connections = feed.connections
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # unheard, as a change on a new primary would be
        conn.execute(f'UPDATE "{schema}".api_keys SET revoked_at = now() WHERE key_id = %s', (made.key.key_id,))
    assert keys.resolve(made.secret) is not None
    served.datastore.connections_lost += 1  # what the pool counts when it finds a connection ended by the server
    assert keys.resolve(made.secret) is None
    other = operator.api_keys().add("beta")
    assert keys.resolve(other.secret) is not None and feed.connections == connections + 1  # at once, no pause


def test_with_the_cache_off_every_resolve_reads_and_no_connection_listens(pg_dsn: str, schema: str,
                                                                          operator: Commitline) -> None:
    made = operator.api_keys().add("acme")
    with bootstrap(settings_for(pg_dsn, schema, api_key_cache_s=0)) as app:
        assert app.api_keys().cache is None
        assert app.api_keys().resolve(made.secret) is not None
        operator.api_keys().revoke("acme")
        assert app.api_keys().resolve(made.secret) is None


def test_closing_the_app_closes_the_listening_connection(pg_dsn: str, schema: str, operator: Commitline) -> None:
    made = operator.api_keys().add("acme")
    app = bootstrap(settings_for(pg_dsn, schema))
    try:
        keys = app.api_keys()
        assert keys.resolve(made.secret) is not None and keys.cache is not None
        pid = keys.cache.feed.backend_pid
    finally:
        app.close()

    def gone() -> bool:
        with psycopg.connect(pg_dsn) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 0

    wait_for(gone, "the listening session to end")
