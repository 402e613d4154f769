"""Reading the examples' read models: the query methods behind their tables, and the JSON shapes their
HTTP routes answer with (for ``/openapi.json``).

Queries about one aggregate are asked as a tenant (default ``"default"``, as for dispatch) and see only
that tenant's rows: another tenant's aggregate is not found (the same answer as for an unused id).
A read model whose projection has never run has no table yet, and reads as empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from uuid import UUID, uuid5

from pydantic import BaseModel, ConfigDict, Field

from commitline import Reads

SAGA_NAMESPACE = UUID("8d2f4b61-0c5e-4f0a-9b7d-3e6a1c9f2d58")


def fulfilment_id(order_id: UUID) -> UUID:
    """The id of an order's fulfilment saga (its own stream), derived from the order's."""
    return uuid5(SAGA_NAMESPACE, str(order_id))


def payment_id_for(order_id: UUID) -> UUID:
    """The id of the payment the fulfilment saga creates for an order, derived from the order's."""
    return uuid5(SAGA_NAMESPACE, f"payment/{order_id}")


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


@dataclass(frozen=True)
class FulfilmentRow:
    order_id: UUID
    tenant: str
    state: str
    failure: str
    stuck: str


class ExampleReads(Reads):
    def task_counts(self, task_id: UUID, tenant: str = "default") -> dict[str, int]:
        """Users per status for one survey task, e.g. {"PENDING": 9000, "DONE": 1000}; {} if the tenant has
        no such task."""
        return {s: int(n) for s, n in self.rows("SELECT status, users FROM {t} WHERE task_id = %s AND tenant = %s",
                                                "rm_task_statuses", (task_id, self.tenant(tenant)))}

    def tenant_task_counts(self, tenant: str) -> dict[UUID, dict[str, int]]:
        counts: dict[UUID, dict[str, int]] = {}
        for task_id, status, users in self.rows(
                "SELECT task_id, status, users FROM {t} WHERE tenant = %s ORDER BY task_id, status",
                "rm_task_statuses", (self.tenant(tenant),)):
            counts.setdefault(task_id, {})[status] = int(users)
        return counts

    def payment_totals(self, tenant: str | None = "default") -> list[PaymentTotal]:
        """Payments and their total amount per (tenant, state, currency) of ``tenant`` (None: of every
        tenant, for operators); empty groups left out."""
        where = "WHERE payments <> 0" + (" AND tenant = %s" if self.tenant_or_all(tenant) else "")
        rows = self.rows(f"SELECT tenant, state, currency, payments, amount FROM {{t}} {where} "
                         "ORDER BY tenant, state, currency", "rm_payment_totals",
                         (tenant,) if tenant is not None else ())
        return [PaymentTotal(t, s, c, int(n), a) for t, s, c, n, a in rows]

    def payment_state(self, payment_id: UUID, tenant: str = "default") -> str | None:
        """The payment's state; None if the tenant has no such payment."""
        rows = self.rows("SELECT state FROM {t} WHERE payment_id = %s AND tenant = %s", "rm_payments",
                         (payment_id, self.tenant(tenant)))
        return rows[0][0] if rows else None

    def inventory_level(self, item_id: UUID, tenant: str = "default") -> InventoryLevel | None:
        """The item's stock; None if the tenant has no such item."""
        rows = self.rows("SELECT on_hand, reserved FROM {t} WHERE item_id = %s AND tenant = %s",
                         "rm_inventory_levels", (item_id, self.tenant(tenant)))
        return InventoryLevel(int(rows[0][0]), int(rows[0][1])) if rows else None

    def fulfilments(self, *, stuck_only: bool = False, tenant: str | None = None) -> list[FulfilmentRow]:
        """Order fulfilments (with ``stuck_only``, only those waiting for a person: STUCK or PARKED) of
        ``tenant``, or of every tenant (None, the default: the operator's view behind ``status`` and ``sagas list``)."""
        conditions = ["state IN ('STUCK', 'PARKED')"] if stuck_only else []
        if self.tenant_or_all(tenant):
            conditions.append("tenant = %s")
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        rows = self.rows(f"SELECT order_id, tenant, state, coalesce(failure, ''), coalesce(stuck, '') FROM {{t}} "
                         f"{where} ORDER BY order_id", "rm_order_fulfilments",
                         (tenant,) if tenant is not None else ())
        return [FulfilmentRow(*row) for row in rows]

    def fulfilment(self, order_id: UUID, tenant: str = "default") -> FulfilmentRow | None:
        """The fulfilment of one order; None if the tenant has no such order (or it has not started)."""
        rows = self.rows("SELECT order_id, tenant, state, coalesce(failure, ''), coalesce(stuck, '') FROM {t} "
                         "WHERE saga_id = %s AND tenant = %s", "rm_order_fulfilments",
                         (fulfilment_id(order_id), self.tenant(tenant)))
        return FulfilmentRow(*rows[0]) if rows else None


# -- what the HTTP routes over these answer (``/openapi.json``) ------------------------------------------

class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskStatusesOut(Shape):
    task_id: UUID
    statuses: dict[str, int] = Field(description="users per status, e.g. {\"DONE\": 1000, \"PENDING\": 9000}")


class PaymentTotalOut(Shape):
    state: str
    currency: str
    payments: int
    amount: str = Field(description="the sum, as a decimal string")


class PaymentTotalsOut(Shape):
    tenant: str
    totals: list[PaymentTotalOut] = Field(description="per (state, currency) with at least one payment")


class InventoryLevelOut(Shape):
    item_id: UUID
    on_hand: int
    reserved: int
    available: int = Field(description="on_hand - reserved")


class FulfilmentOut(Shape):
    order_id: UUID
    tenant: str
    state: str
    failure: str = Field(description="the failed step and why; empty if none")
    stuck: str = Field(description="why it waits for a person; empty unless it is STUCK (or PARKED)")


class FulfilmentsOut(Shape):
    fulfilments: list[FulfilmentOut]
