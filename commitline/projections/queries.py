"""Reading the read models: the query API behind the projections' tables.

Queries about one aggregate are asked as a tenant (default ``"default"``, as for dispatch) and see only
that tenant's rows: another tenant's aggregate is not found (the same answer as for an unused id).
A read model whose projection has never run has no table yet, and reads as empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

from eventsourcing.persistence import ProgrammingError
from eventsourcing.postgres import PostgresDatastore
from psycopg.errors import UndefinedTable
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.application.boundary import check_tenant
from commitline.domain.fulfilment import fulfilment_id


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
        try:
            with self.datastore.get_connection() as conn:
                return conn.cursor(row_factory=tuple_row).execute(
                    SQL(query).format(t=Identifier(self.schema, table)), params).fetchall()
        except ProgrammingError as e:  # eventsourcing's wrapper of psycopg's error
            if isinstance(e.__cause__, UndefinedTable):
                return []
            raise

    def task_counts(self, task_id: UUID, tenant: str = "default") -> dict[str, int]:
        """Users per status for one survey task, e.g. {"PENDING": 9000, "DONE": 1000}; {} if the tenant has
        no such task."""
        return {s: int(n) for s, n in self._rows("SELECT status, users FROM {t} WHERE task_id = %s AND tenant = %s",
                                                  "rm_task_statuses", (task_id, check_tenant(tenant)))}

    def tenant_task_counts(self, tenant: str) -> dict[UUID, dict[str, int]]:
        counts: dict[UUID, dict[str, int]] = {}
        for task_id, status, users in self._rows(
                "SELECT task_id, status, users FROM {t} WHERE tenant = %s ORDER BY task_id, status",
                "rm_task_statuses", (check_tenant(tenant),)):
            counts.setdefault(task_id, {})[status] = int(users)
        return counts

    def payment_totals(self, tenant: str | None = "default") -> list[PaymentTotal]:
        """Payments and their total amount per (tenant, state, currency) of ``tenant`` (None: of every
        tenant, for operators); empty groups left out."""
        where = "WHERE payments <> 0" + (" AND tenant = %s" if check_tenant_or_all(tenant) else "")
        rows = self._rows(f"SELECT tenant, state, currency, payments, amount FROM {{t}} {where} "
                          "ORDER BY tenant, state, currency", "rm_payment_totals",
                          (tenant,) if tenant is not None else ())
        return [PaymentTotal(t, s, c, int(n), a) for t, s, c, n, a in rows]

    def payment_state(self, payment_id: UUID, tenant: str = "default") -> str | None:
        """The payment's state; None if the tenant has no such payment."""
        rows = self._rows("SELECT state FROM {t} WHERE payment_id = %s AND tenant = %s", "rm_payments",
                          (payment_id, check_tenant(tenant)))
        return rows[0][0] if rows else None

    def inventory_level(self, item_id: UUID, tenant: str = "default") -> InventoryLevel | None:
        """The item's stock; None if the tenant has no such item."""
        rows = self._rows("SELECT on_hand, reserved FROM {t} WHERE item_id = %s AND tenant = %s",
                          "rm_inventory_levels", (item_id, check_tenant(tenant)))
        return InventoryLevel(int(rows[0][0]), int(rows[0][1])) if rows else None

    def fulfilments(self, *, stuck_only: bool = False, tenant: str | None = None) -> list[FulfilmentRow]:
        """Order fulfilments (with ``stuck_only``, only those waiting for a person: STUCK or PARKED) of
        ``tenant``, or of every tenant (None, the default: the operator's view behind ``status`` and ``sagas list``)."""
        conditions = ["state IN ('STUCK', 'PARKED')"] if stuck_only else []
        if check_tenant_or_all(tenant):
            conditions.append("tenant = %s")
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        rows = self._rows(f"SELECT order_id, tenant, state, coalesce(failure, ''), coalesce(stuck, '') FROM {{t}} "
                          f"{where} ORDER BY order_id", "rm_order_fulfilments",
                          (tenant,) if tenant is not None else ())
        return [FulfilmentRow(*row) for row in rows]

    def fulfilment(self, order_id: UUID, tenant: str = "default") -> FulfilmentRow | None:
        """The fulfilment of one order; None if the tenant has no such order (or it has not started)."""
        rows = self._rows("SELECT order_id, tenant, state, coalesce(failure, ''), coalesce(stuck, '') FROM {t} "
                          "WHERE saga_id = %s AND tenant = %s", "rm_order_fulfilments",
                          (fulfilment_id(order_id), check_tenant(tenant)))
        return FulfilmentRow(*rows[0]) if rows else None


def check_tenant_or_all(tenant: str | None) -> bool:
    """Whether to filter by ``tenant`` (None: every tenant); InvalidTenant for an invalid one."""
    return tenant is not None and bool(check_tenant(tenant))


@dataclass(frozen=True)
class FulfilmentRow:
    order_id: UUID
    tenant: str
    state: str
    failure: str
    stuck: str
