"""The idempotency retention job removes only records older than the period, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest

from commitline.application.errors import AggregateAlreadyExists
from commitline.composition import Commitline
from commitline.infrastructure.store.retention import expire_idempotency_records
from tests.support import count_rows

PAYMENT = {"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "a"}


def test_expire_removes_only_old_records(app: Commitline, pg_dsn: str, schema: str) -> None:
    for n in range(12):
        app.dispatch(PAYMENT, idempotency_key=f"k{n}")
    with psycopg.connect(pg_dsn) as conn:  # age seven of them
        conn.execute(f"UPDATE {schema}.idempotency_keys SET recorded_at = now() - interval '40 days' "
                     "WHERE key IN ('k0','k1','k2','k3','k4','k5','k6')")
    assert expire_idempotency_records(app.datastore, timedelta(days=30), dry_run=True) == 7
    assert count_rows(pg_dsn, schema)["idempotency_keys"] == 12
    assert expire_idempotency_records(app.datastore, timedelta(days=30)) == 7
    assert count_rows(pg_dsn, schema) == {"events": 12, "idempotency_keys": 5, "snapshots": 0}
    assert app.dispatch(PAYMENT, idempotency_key="k11").replayed
    # After expiry a late retry is a new command; the domain still refuses to create the payment twice.
    with pytest.raises(AggregateAlreadyExists):
        app.dispatch(PAYMENT, idempotency_key="k0")
    with pytest.raises(ValueError):
        expire_idempotency_records(app.datastore, timedelta(0))


def test_expire_command(app: Commitline, pg_dsn: str, schema: str) -> None:
    app.dispatch(PAYMENT, idempotency_key="k")
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    run = [sys.executable, "-m", "commitline.cli", "idempotency", "expire"]
    out = subprocess.run([*run, "--older-than-days", "30"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "deleted 0 idempotency records" in out.stdout
    for days in ("0", "999999999", "99999999999"):  # none, or before any date PostgreSQL (or Python) can hold
        bad = subprocess.run([*run, "--older-than-days", days], env=env, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stdout == "", bad.stderr
        assert bad.stderr.strip() == "idempotency expire: --older-than-days must be between 1 and 365000"
