"""The data folder's local services (its embedded PostgreSQL and, when no Kafka is configured, its embedded
broker), kept running between commands (``commitline up``) and stopped when done (``down``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from commitline.application.errors import ConfigurationError
from commitline.infrastructure.config import Settings
from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.local import shared_kafka, shared_postgres


def local_services(settings: Settings) -> dict[str, Any]:
    """The shared servers the settings leave to the data folder, by name (``postgres``, ``kafka``): none when
    COMMITLINE_DATABASE_URL is set."""
    services: dict[str, Any] = {}
    if settings.database_url is None:
        services["postgres"] = shared_postgres(settings.data_dir)
        if settings.kafka_bootstrap_servers is None:
            services["kafka"] = shared_kafka(settings.data_dir)
    return services


def keep_running(services: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Start each service (or find it running) and pin it, so it runs until ``stop``: per service, its
    ``state`` (started, already running) and where it is (``at``). ConfigurationError naming
    COMMITLINE_DATA_DIR when one cannot be started; the ones before it keep running."""
    report: dict[str, dict[str, str]] = {}
    for name, shared in services.items():
        try:
            server = shared.acquire()
            shared.pin()
        except EmbeddedServiceError as e:
            raise ConfigurationError("COMMITLINE_DATA_DIR", str(e)) from None
        finally:
            shared.release()  # pinned: it keeps running
        where = server.dsn if name == "postgres" else server.bootstrap_servers
        report[name] = {"state": "started" if shared.started_here else "already running", "at": where}
    return report


def stop(services: dict[str, Any], *, force: bool = False) -> Iterator[tuple[str, str, bool]]:
    """Unpin and stop each service unless other processes use it (or with ``force``), one at a time: its name,
    what became of it (stopped, in use, was not running), and whether it was refused for being in use."""
    for name, shared in services.items():
        shared.unpin()
        running, stopped = shared.stop_if_unused(force=force)
        yield name, "stopped" if stopped else "in use" if running else "was not running", running and not stopped
