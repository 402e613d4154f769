"""Every shape of a failure to reach or use PostgreSQL becomes StoreUnavailable, without the password."""

from __future__ import annotations

import psycopg
import pytest
from eventsourcing import persistence
from psycopg_pool import PoolClosed, PoolTimeout

from commitline.application.errors import Closed, StoreUnavailable
from commitline.infrastructure.store.datastore import store_failures

PARTS = {"host": "db.example", "port": 5432, "dbname": "ledger", "user": "app", "password": "hunter2"}


def _wrapped(error: Exception) -> Exception:
    try:
        raise persistence.OperationalError(str(error)) from error
    except persistence.OperationalError as e:
        return e


@pytest.mark.parametrize("error, shown", [
    (psycopg.OperationalError("password hunter2 rejected"), "OperationalError: password *** rejected"),
    (psycopg.errors.AdminShutdown("terminating connection"), "AdminShutdown: terminating connection"),
    (psycopg.InterfaceError("the connection is closed"), "InterfaceError: the connection is closed"),
    (PoolTimeout("couldn't get a connection after 5.00 sec"), "PoolTimeout: couldn't get a connection"),
    (_wrapped(psycopg.errors.AdminShutdown("bye")), "AdminShutdown: bye"),  # eventsourcing's wrapper
])
def test_store_failures_become_store_unavailable_without_the_password(error: Exception, shown: str) -> None:
    seen: list[BaseException] = []
    with pytest.raises(StoreUnavailable) as raised, store_failures(PARTS, seen.append):
        raise error
    message = str(raised.value)
    assert "hunter2" not in message and shown in message and "db.example:5432/ledger as app" in message
    assert raised.value.code == "store_unavailable" and len(seen) == 1


@pytest.mark.parametrize("error", [PoolClosed("the pool is closed"), _wrapped(PoolClosed("the pool is closed"))])
def test_a_closed_pool_is_a_use_after_close_not_an_outage(error: Exception) -> None:
    seen: list[BaseException] = []
    with pytest.raises(Closed) as raised, store_failures(PARTS, seen.append):
        raise error
    assert raised.value.code == "closed" and not seen  # not counted as a lost connection


def test_other_errors_pass_unchanged() -> None:
    error = psycopg.errors.UniqueViolation("duplicate key")
    with pytest.raises(type(error)), store_failures(PARTS):
        raise error


def test_a_multi_host_url_is_named_host_by_host() -> None:
    from commitline.infrastructure.store.datastore import describe_failure

    parts = {**PARTS, "host": "db1.example,db2.example", "port": "5432,5433"}
    assert describe_failure(OSError("refused"), parts).startswith(
        "cannot use PostgreSQL at db1.example:5432,db2.example:5433/ledger as app: ")
    one_port = describe_failure(OSError("refused"), {**parts, "port": "6432"})
    assert "at db1.example:6432,db2.example:6432/ledger" in one_port and "hunter2" not in one_port
