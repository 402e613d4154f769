"""eventsourcing's own test cases run against ``commitline.eventsourcing``."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict


def library_environment(dsn: str, schema: str, **extra: str) -> dict[str, str]:
    """eventsourcing's environment variables for the persistence module on ``dsn``, in ``schema``."""
    parts = conninfo_to_dict(dsn)
    return {
        "PERSISTENCE_MODULE": "commitline.eventsourcing",
        "CREATE_TABLE": "y",
        "POSTGRES_DBNAME": str(parts.get("dbname", "postgres")),
        "POSTGRES_HOST": str(parts.get("host", "127.0.0.1")),
        "POSTGRES_PORT": str(parts.get("port", "5432")),
        "POSTGRES_USER": str(parts.get("user", "postgres")),
        "POSTGRES_PASSWORD": str(parts.get("password", "")),
        "POSTGRES_SCHEMA": schema,
        **extra,
    }
