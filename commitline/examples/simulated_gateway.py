"""A simulated payment gateway for tests and the demo, keeping its ledger in PostgreSQL so it
outlives the processes that call it (as a real gateway outlives ours).

Behaviour is chosen per order by tokens in the account reference, ``|``-separated:

    authorize-declines        authorize is refused (card declined)
    authorize-fails-once      the first authorize raises GatewayUnavailable, nothing is held
    authorize-times-out-once  the first authorize holds the amount, then raises GatewayTimeout
    capture-declines          capture is always refused
    void-fails                void always raises GatewayUnavailable

Every operation is idempotent per key, like a real gateway's idempotency keys: a repeated
authorize returns the same hold, a repeated capture charges nothing more.

The ledger's ``account`` column keeps only those tokens, never the account itself: the account is personal data
(erased with its holder in commitline's store), and this table, kept beside the store, is out of an erasure's reach.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.examples.payment_gateway import GatewayDeclined, GatewayTimeout, GatewayUnavailable

log = logging.getLogger(__name__)
LEDGER = "simulated_gateway_ledger"
CALLS = "simulated_gateway_calls"
_Call = tuple[psycopg.Connection[Any], tuple[str, str] | None, int]


TOKENS = frozenset({"authorize-declines", "authorize-fails-once", "authorize-times-out-once", "capture-declines",
                    "void-fails"})


def behaviour(tokens: set[str]) -> str:
    """What the ledger keeps of an account: the behaviour tokens it holds, ``|``-separated (often nothing)."""
    return "|".join(sorted(tokens & TOKENS))


class SimulatedGateway:
    def __init__(self, conninfo: dict[str, Any], schema: str):
        self.conninfo = conninfo
        self.ledger = Identifier(schema, LEDGER)
        self.calls = Identifier(schema, CALLS)
        with self._connect() as conn, conn.transaction():
            # The demo gateway's own tables, created on first use; the lock makes concurrent first uses safe.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"commitline-schema-{schema}",))
            conn.execute(SQL("CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, amount numeric NOT NULL, "
                             "currency text NOT NULL, account text NOT NULL, status text NOT NULL, "
                             "captures int NOT NULL DEFAULT 0)").format(self.ledger))
            conn.execute(SQL("CREATE TABLE IF NOT EXISTS {} (key text, operation text, calls int NOT NULL, "
                             "PRIMARY KEY (key, operation))").format(self.calls))

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(**self.conninfo, autocommit=True)

    def _call_number(self, conn: psycopg.Connection[Any], key: str, operation: str) -> int:
        return conn.cursor(row_factory=tuple_row).execute(SQL(
            "INSERT INTO {} (key, operation, calls) VALUES (%s, %s, 1) ON CONFLICT (key, operation) "
            "DO UPDATE SET calls = {}.calls + 1 RETURNING calls").format(self.calls, self.calls),
            (key, operation)).fetchone()[0]

    def _status(self, conn: psycopg.Connection[Any], key: str) -> tuple[str, str] | None:
        row = conn.cursor(row_factory=tuple_row).execute(
            SQL("SELECT status, account FROM {} WHERE key = %s FOR UPDATE").format(self.ledger), (key,)).fetchone()
        return (row[0], row[1]) if row else None

    @contextmanager
    def _operation(self, key: str, operation: str) -> Iterator[_Call]:
        """One call of ``operation`` under ``key``: counted first (even when the call then fails), then a
        transaction holding the key's ledger row locked; yields (connection, (status, account) or None,
        which call of this operation under this key it is)."""
        with self._connect() as conn:
            call = self._call_number(conn, key, operation)
        with self._connect() as conn, conn.transaction():
            yield conn, self._status(conn, key), call

    def authorize(self, key: str, amount: Decimal, currency: str, account: str) -> str:
        tokens = set(account.split("|"))
        with self._operation(key, "authorize") as (conn, existing, call):
            if existing is not None:
                if existing[0] == "VOIDED":
                    raise GatewayDeclined("the authorization under this key was voided")
                return f"auth-{key}"
            if "authorize-declines" in tokens:
                raise GatewayDeclined("card declined")
            if "authorize-fails-once" in tokens and call == 1:
                raise GatewayUnavailable("gateway unavailable (simulated)")
            conn.execute(SQL("INSERT INTO {} (key, amount, currency, account, status) VALUES (%s, %s, %s, %s, "
                             "'AUTHORIZED')").format(self.ledger), (key, amount, currency, behaviour(tokens)))
        if "authorize-times-out-once" in tokens and call == 1:
            raise GatewayTimeout("no answer from the gateway (simulated; the hold was made)")
        return f"auth-{key}"

    def capture(self, key: str) -> str:
        with self._operation(key, "capture") as (conn, existing, _):
            if existing is None or existing[0] == "VOIDED":
                raise GatewayDeclined("nothing authorized under this key")
            if "capture-declines" in existing[1].split("|"):
                raise GatewayDeclined("capture refused")
            if existing[0] == "AUTHORIZED":
                conn.execute(SQL("UPDATE {} SET status = 'CAPTURED', captures = captures + 1 WHERE key = %s").format(
                    self.ledger), (key,))
        return f"capture-{key}"

    def void(self, key: str) -> None:
        with self._operation(key, "void") as (conn, existing, _):
            if existing is not None and "void-fails" in existing[1].split("|"):
                raise GatewayUnavailable("void failed (simulated)")
            if existing is None:  # refuse a late authorize under this key
                conn.execute(SQL("INSERT INTO {} (key, amount, currency, account, status) VALUES "
                                 "(%s, 0, '', '', 'VOIDED')").format(self.ledger), (key,))
            elif existing[0] == "CAPTURED":
                raise GatewayDeclined("a captured payment cannot be voided")
            else:
                conn.execute(SQL("UPDATE {} SET status = 'VOIDED' WHERE key = %s").format(self.ledger), (key,))

    def ledger_rows(self) -> dict[str, tuple[str, int]]:
        """key -> (status, captures), for tests and the demo."""
        with self._connect() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                SQL("SELECT key, status, captures FROM {}").format(self.ledger)).fetchall()
        return {k: (s, c) for k, s, c in rows}


def create(context: Any) -> SimulatedGateway:
    """The ``COMMITLINE_GATEWAY=simulated`` factory (``gateways.py``)."""
    return SimulatedGateway(context.conninfo, context.settings.schema_name)
