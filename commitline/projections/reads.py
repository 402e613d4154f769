"""Reading read-model tables: the base of a domain's query class (``Domain.reader``).

A query is asked as a tenant and sees only that tenant's rows (the read model's handlers record the
tenant of each row; the query filters on it), so another tenant's aggregate is not found, the same
answer as for an unused id. A read model whose projection has never run has no table yet and reads as
empty: ``rows`` answers ``[]`` rather than failing.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.persistence import ProgrammingError
from eventsourcing.postgres import PostgresDatastore
from psycopg.errors import UndefinedTable
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier

from commitline.application.boundary import check_tenant


class Reads:
    """Queries over the read models of one store; subclass it with the domain's own query methods."""

    def __init__(self, datastore: PostgresDatastore):
        self.datastore = datastore
        self.schema = datastore.schema

    def rows(self, query: str, table: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows ``query`` selects, with ``{t}`` standing for ``table`` in the store's schema; [] when the
        table does not exist yet (its projection never ran)."""
        try:
            with self.datastore.get_connection() as conn:
                return conn.cursor(row_factory=tuple_row).execute(
                    SQL(query).format(t=Identifier(self.schema, table)), params).fetchall()  # type: ignore[arg-type]
        except ProgrammingError as e:  # eventsourcing's wrapper of psycopg's error
            if isinstance(e.__cause__, UndefinedTable):
                return []
            raise

    @staticmethod
    def tenant(tenant: str) -> str:
        """``tenant`` if it is a valid tenant name; InvalidTenant otherwise."""
        return check_tenant(tenant)

    @staticmethod
    def tenant_or_all(tenant: str | None) -> bool:
        """Whether to filter by ``tenant`` (None: every tenant, the operator's view); InvalidTenant for an
        invalid one."""
        return tenant is not None and bool(check_tenant(tenant))
