"""Reading the read models: the query API behind the projections' tables."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

from eventsourcing.postgres import PostgresDatastore
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier


@dataclass(frozen=True)
class PaymentTotal:
    tenant: str
    state: str
    currency: str
    payments: int
    amount: Decimal


@dataclass(frozen=True)
class InventoryLevel:
    on_hand: int
    reserved: int

    @property
    def available(self) -> int:
        return self.on_hand - self.reserved


class ReadModels:
    def __init__(self, datastore: PostgresDatastore):
        self.datastore = datastore
        self.schema = datastore.schema

    def _rows(self, query: str, table: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.datastore.get_connection() as conn:
            return conn.cursor(row_factory=tuple_row).execute(
                SQL(query).format(t=Identifier(self.schema, table)), params).fetchall()

    def task_counts(self, task_id: UUID) -> dict[str, int]:
        """Users per status for one survey task, e.g. {"PENDING": 9000, "DONE": 1000}."""
        return {s: int(n) for s, n in self._rows("SELECT status, users FROM {t} WHERE task_id = %s",
                                                  "rm_task_statuses", (task_id,))}

    def tenant_task_counts(self, tenant: str) -> dict[UUID, dict[str, int]]:
        counts: dict[UUID, dict[str, int]] = {}
        for task_id, status, users in self._rows(
                "SELECT task_id, status, users FROM {t} WHERE tenant = %s ORDER BY task_id, status",
                "rm_task_statuses", (tenant,)):
            counts.setdefault(task_id, {})[status] = int(users)
        return counts

    def payment_totals(self, tenant: str | None = None) -> list[PaymentTotal]:
        """Payments and their total amount per (tenant, state, currency); empty groups left out."""
        where = "WHERE payments <> 0" + (" AND tenant = %s" if tenant else "")
        rows = self._rows(f"SELECT tenant, state, currency, payments, amount FROM {{t}} {where} "
                          "ORDER BY tenant, state, currency", "rm_payment_totals", (tenant,) if tenant else ())
        return [PaymentTotal(t, s, c, int(n), a) for t, s, c, n, a in rows]

    def payment_state(self, payment_id: UUID) -> str | None:
        rows = self._rows("SELECT state FROM {t} WHERE payment_id = %s", "rm_payments", (payment_id,))
        return rows[0][0] if rows else None

    def inventory_level(self, item_id: UUID) -> InventoryLevel | None:
        rows = self._rows("SELECT on_hand, reserved FROM {t} WHERE item_id = %s", "rm_inventory_levels", (item_id,))
        return InventoryLevel(int(rows[0][0]), int(rows[0][1])) if rows else None

    def fulfilments(self, *, stuck_only: bool = False) -> list[FulfilmentRow]:
        where = "WHERE state = 'STUCK'" if stuck_only else ""
        rows = self._rows(f"SELECT order_id, tenant, state, coalesce(failure, ''), coalesce(stuck, '') FROM {{t}} "
                          f"{where} ORDER BY order_id", "rm_order_fulfilments")
        return [FulfilmentRow(*row) for row in rows]


@dataclass(frozen=True)
class FulfilmentRow:
    order_id: UUID
    tenant: str
    state: str
    failure: str
    stuck: str
