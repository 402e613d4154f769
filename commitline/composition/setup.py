"""What an entry point settles before it bootstraps anything: its settings, its domain (``Domain``, whose
``Query`` declarations the HTTP server routes), and the kind of process it is (``commitline status`` shows
it). Light to import: no database, Kafka or metrics client is loaded, so ``commitline serve`` can still
choose how ``prometheus_client`` counts before it is imported."""

from __future__ import annotations

from commitline.framework.domain import Domain, Query
from commitline.framework.loading import load_domain
from commitline.infrastructure.config import Settings, load_settings
from commitline.infrastructure.followers.process import set_kind

__all__ = ["Domain", "Query", "Settings", "load_domain", "load_settings", "set_kind"]
