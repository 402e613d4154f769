"""The composition root: ``Commitline``, everything wired together for one domain (``bootstrap()``, in
``wiring.py``, builds it from one configuration and one domain: ``--app`` / ``COMMITLINE_APP``, or given;
the built-in examples by default).

It gives what a program runs: the command processor, the auditor, the read models, the API keys and the
status report (here); the publisher and running followers (``followers.py``); projectors and rebuilds
(``projections.py``); process managers and their runners (``sagas.py``); the operator's store-level work
(``operations.py``); erasing data subjects and rotating the master key (``personal.py``). The CLI, the HTTP
server, the demo, the tests and the benchmarks only call it and render what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from commitline.application.audit import Auditor
from commitline.application.processor import CommandProcessor
from commitline.composition.followers import Followers
from commitline.composition.operations import Operations
from commitline.composition.personal import PersonalDataOperations
from commitline.composition.projections import Projections
from commitline.composition.sagas import Sagas
from commitline.composition.status import StatusReport
from commitline.domain.aggregate import Aggregate
from commitline.framework.domain import Domain
from commitline.infrastructure.config import Settings
from commitline.infrastructure.dispatch_cpu import DispatchCpu
from commitline.infrastructure.embedded.kafka import EmbeddedKafka
from commitline.infrastructure.embedded.local import RunningBroker
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.embedded.shared import SharedServer
from commitline.infrastructure.followers.buckets import parse_bucket_name
from commitline.infrastructure.followers.group_status import group_status, with_buckets_figures
from commitline.infrastructure.followers.health import Thresholds
from commitline.infrastructure.followers.status import follower_statuses
from commitline.infrastructure.kafka.publisher import PUBLISHER
from commitline.infrastructure.liveness import LoopLiveness
from commitline.infrastructure.store.api_key_cache import ApiKeyCache, ChangeFeed
from commitline.infrastructure.store.api_keys import ApiKeys, changes_channel
from commitline.infrastructure.store.audit_source import PostgresAuditSource
from commitline.infrastructure.store.codec import EventCodec
from commitline.infrastructure.store.datastore import StoreDatastore
from commitline.infrastructure.store.event_store import PostgresEventStore, stored_tenant
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.tracing import Tracing
from commitline.projections.reads import Reads

A = TypeVar("A", bound=Aggregate)


@dataclass
class Commitline(Followers, Projections, Sagas, Operations, PersonalDataOperations):
    """Everything wired together for one domain; close it to release connections and stop embedded services."""

    settings: Settings
    datastore: StoreDatastore
    recorder: EventRecorder
    store: PostgresEventStore
    processor: CommandProcessor
    conninfo: dict[str, Any] = field(repr=False)
    embedded_postgres: EmbeddedPostgres | None = None
    embedded_kafka: EmbeddedKafka | None = None
    shared_postgres: SharedServer[EmbeddedPostgres] | None = field(default=None, repr=False)
    shared_kafka: SharedServer[RunningBroker] | None = field(default=None, repr=False)
    dispatch_cpu: DispatchCpu = field(default_factory=lambda: DispatchCpu(None))
    domain: Domain = field(default=None, repr=False)  # type: ignore[assignment]  # set by bootstrap
    tracing: Tracing | None = field(default=None, repr=False)  # OTEL_*: None unless traces are asked for
    liveness: LoopLiveness = field(default_factory=LoopLiveness, repr=False)  # probed by /healthz of --metrics-port
    #: this process made the store: the schema held none (a read-only command says so: a mistyped schema?)
    created_store: bool = False
    #: a new Commitline on these settings and this domain, with connections of its own (set by bootstrap; a forked
    #: rebuild worker opens its own with it)
    reopen: Callable[[], Commitline] | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)
    _api_keys: ApiKeys | None = field(default=None, repr=False)

    @property
    def codec(self) -> EventCodec:
        return self.store.codec

    # -- commands and queries ----------------------------------------------------------

    def dispatch(self, command: Any, *, idempotency_key: str | None, tenant: str = "default"):
        return self.processor.dispatch(command, idempotency_key=idempotency_key, tenant=tenant)

    def load(self, cls: type[A], aggregate_id: UUID, *, tenant: str | None = None) -> A:
        """The aggregate as of its latest event (blank, version 0, if it has none). With ``tenant``, another
        tenant's stream raises AggregateNotFound, as a command or read of it would."""
        if tenant is None:
            return self.store.load(cls, aggregate_id)
        return self._manager_base().load(cls, aggregate_id, tenant)

    def auditor(self) -> Auditor:
        return Auditor(PostgresAuditSource(self.recorder, self.codec), self.domain.registry.aggregate_types,
                       stored_tenant)

    def read_models(self) -> Reads:
        """The domain's read-model queries (its ``Reads`` subclass) over this store."""
        return self.domain.reads_class(self.datastore)

    def api_keys(self) -> ApiKeys:
        if self._api_keys is None:  # one, its queries composed once: the HTTP API resolves a key per request
            schema, ttl_s = self.settings.schema_name, self.settings.api_key_cache_s
            # The cache's listening connection opens at the first resolve: a process that never serves has none.
            feed = ChangeFeed(self.conninfo, changes_channel(schema), lambda: self.datastore.connections_lost)
            cache = ApiKeyCache(feed, ttl_s) if ttl_s > 0 else None
            self._api_keys = ApiKeys(self.datastore.get_connection, schema, cache)
        return self._api_keys

    def status(self) -> StatusReport:
        # The publisher's bucket rows are shown per publish instance (``publisher``), not as followers.
        sagas = tuple(sorted(self.domain.managers))
        head, followers = follower_statuses(self.recorder, [PUBLISHER, *sagas, *sorted(self.domain.projections)],
                                            include=lambda name: parse_bucket_name(name) is None)
        limits = Thresholds(self.settings.status_max_lag_events, self.settings.status_max_lag_s)
        publisher = group_status(self.recorder, PUBLISHER, self.settings.publish_buckets, head)
        followers = [with_buckets_figures(s, publisher) if s.name == PUBLISHER else s for s in followers]
        last, last_all = self.last_verifications()
        broken = next((run for run in (last, last_all) if run is not None and not run.ok), None)
        return StatusReport(head, followers, self.stuck_sagas(), limits, publisher, sagas, broken)

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.tracing is not None:  # the spans of a one-shot command leave before it exits
            self.tracing.flush()
        self.store.close()  # the snapshots it still holds are written
        if self.store.codec.personal is not None:  # its erasure notifications' connection
            self.store.codec.personal.close()
        if self._api_keys is not None:  # its change notifications' connection
            self._api_keys.close()
        self.datastore.close()
        self.dispatch_cpu.close()
        if self.embedded_kafka is not None:
            self.embedded_kafka.stop()
        if self.shared_kafka is not None:  # each stopped only if no other process uses it
            self.shared_kafka.release()
        if self.shared_postgres is not None:
            self.shared_postgres.release()

    def __enter__(self) -> Commitline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
