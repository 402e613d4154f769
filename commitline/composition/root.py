"""The composition root: settings + a domain -> database (configured or embedded) -> store -> every runnable.

``bootstrap()`` returns a ``Commitline`` that builds, from one configuration and one domain (``--app`` /
``COMMITLINE_APP``, or given; the built-in examples by default), everything a program runs: the command
processor, the Kafka publisher, the projectors, the process managers and their runners, the auditor, the
read models, rebuilds and the status report, and ``run_until_signalled`` to run followers until
SIGINT/SIGTERM. The CLI, the HTTP server, the demo, the tests and the benchmarks only call it and render
what it returns.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

import psycopg

from commitline.application.audit import Auditor
from commitline.application.errors import ConfigurationError, InvalidDomain, StoreUnavailable
from commitline.application.process import ProcessManager, StuckInstance
from commitline.application.processor import CommandProcessor
from commitline.application.retry import RetryPolicy
from commitline.composition.status import StatusReport
from commitline.domain.aggregate import Aggregate
from commitline.framework.checks import stored_problems
from commitline.framework.domain import Domain, PortContext
from commitline.framework.loading import load_domain
from commitline.infrastructure import migrations
from commitline.infrastructure.config import Settings, load_settings
from commitline.infrastructure.dispatch_cpu import DispatchCpu
from commitline.infrastructure.embedded.kafka import EmbeddedKafka
from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.local import RunningBroker, shared_kafka, shared_postgres
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.liveness import LoopLiveness
from commitline.infrastructure.tracing import Tracing, tracing_for
from commitline.infrastructure.embedded.shared import SharedServer
from commitline.infrastructure.followers.engine import Follower
from commitline.infrastructure.followers.buckets import parse_bucket_name
from commitline.infrastructure.followers.group_status import group_status
from commitline.infrastructure.followers.health import Thresholds
from commitline.infrastructure.followers.status import follower_statuses
from commitline.infrastructure.followers.thread import FollowerThread
from commitline.infrastructure.kafka.producer import client_options
from commitline.infrastructure.kafka.publisher import PUBLISHER, Publisher
from commitline.infrastructure.kafka.reader import ConsumedRecord, read_topics
from commitline.infrastructure.metrics import CommandMetrics
from commitline.infrastructure.sagas.runner import ProcessRunner
from commitline.infrastructure.store.api_keys import ApiKeys
from commitline.infrastructure.store.audit_source import PostgresAuditSource
from commitline.infrastructure.store.codec import EventCodec
from commitline.infrastructure.store.datastore import StoreDatastore, connect_options, describe_failure
from commitline.infrastructure.store import event_versions
from commitline.infrastructure.store.event_store import PostgresEventStore, stored_tenant
from commitline.infrastructure.store.event_versions import EventVersions
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.projections.base import Projection
from commitline.projections.projector import Projector
from commitline.projections.reads import Reads
from commitline.projections.rebuild import Progress, RebuildResult, rebuild, rebuild_many
from commitline.projections.rebuild import abort as abort_rebuild
from commitline.projections.storage import table_exists

log = logging.getLogger(__name__)
READY_PROBE_TIMEOUT_S = 0.8  # /readyz answers within a second, the database up or not


A = TypeVar("A", bound=Aggregate)


class UnknownProjection(LookupError):
    def __init__(self, unknown: Iterable[str], known: Iterable[str]):
        super().__init__(f"unknown projection(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


class UnknownProcessManager(LookupError):
    def __init__(self, unknown: str, known: Iterable[str], domain: str = ""):
        names = sorted(known)
        if not names:
            super().__init__(f"the domain {domain!r} declares no process manager")
        elif not unknown:
            super().__init__(f"the domain has several process managers: name one with --saga ({', '.join(names)})")
        else:
            super().__init__(f"unknown process manager {unknown!r}; known: {', '.join(names)}")


@dataclass
class Commitline:
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
    _closed: bool = field(default=False, repr=False)

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
        return ApiKeys(self.datastore.get_connection, self.settings.schema_name)

    def unready(self) -> list[str]:
        """Why this process cannot serve now ([] when it can): the database does not answer, or its schema
        is not at the version this commitline needs."""
        try:
            with self.datastore.probe_connection(READY_PROBE_TIMEOUT_S) as conn:
                missing = migrations.pending(conn, self.settings.schema_name)
        except migrations.SchemaTooNew as e:
            return [str(e)]
        except Exception as e:
            return [f"database unreachable: {describe_failure(e, self.conninfo)}"]
        return [f"schema {self.settings.schema_name} lacks migration {m.version} ({m.description}); "
                "run commitline migrate" for m in missing]

    def status(self) -> StatusReport:
        # The publisher's bucket rows are shown per publish instance (``publisher``), not as followers.
        sagas = tuple(sorted(self.domain.managers))
        head, followers = follower_statuses(self.recorder, [PUBLISHER, *sagas, *sorted(self.domain.projections)],
                                            include=lambda name: parse_bucket_name(name) is None)
        limits = Thresholds(self.settings.status_max_lag_events, self.settings.status_max_lag_s)
        publisher = group_status(self.recorder, PUBLISHER, self.settings.publish_buckets, head)
        return StatusReport(head, followers, self.stuck_sagas(), limits, publisher, sagas)

    def stuck_sagas(self, tenant: str | None = None) -> list[StuckInstance]:
        """Every process manager's instances waiting for a person (of ``tenant``, or of every tenant); none
        from one whose read models have not been built yet."""
        stuck: list[StuckInstance] = []
        reads = self.read_models()
        for name, cls in sorted(self.domain.managers.items()):
            with self.datastore.get_connection() as conn:
                built = all(table_exists(conn, self.datastore.schema, self.projection(model))
                            for model in cls.read_models)
            if built:
                stuck += self._manager_base(cls).stuck(reads, tenant)
        return stuck

    # -- followers ---------------------------------------------------------------------

    def start_embedded_kafka_if_unset(self) -> Settings:
        """Settings to publish with: the configured Kafka, or else a freshly started embedded Tansu broker.
        An explicit choice of a throwaway broker (the demo, tests, benchmarks); ``publisher()`` decides
        for itself when it may use one."""
        if self.settings.kafka_bootstrap_servers is not None:
            return self.settings
        if self.embedded_postgres is not None:  # the data folder's broker, shared like its PostgreSQL
            if self.shared_kafka is None:
                self.shared_kafka = shared_kafka(self.settings.data_dir)
                broker = self.shared_kafka.acquire()
                log.info("%s embedded Kafka-protocol broker (Tansu, records in memory only) at %s",
                         "started" if self.shared_kafka.started_here else "using the running",
                         broker.bootstrap_servers)
            bootstrap_servers = self.shared_kafka.instance.bootstrap_servers  # type: ignore[union-attr]
        else:
            if self.embedded_kafka is None:
                self.embedded_kafka = EmbeddedKafka()
                self.embedded_kafka.start()
                log.info("started a private embedded Kafka-protocol broker (Tansu, records in memory only) at %s",
                         self.embedded_kafka.bootstrap_servers)
            bootstrap_servers = self.embedded_kafka.bootstrap_servers
        # Tansu rejects InitProducerId, so the embedded broker runs without producer idempotence.
        return self.settings.model_copy(update={"kafka_bootstrap_servers": bootstrap_servers, "kafka_idempotence": False})

    def publisher(self, settings: Settings | None = None, **options: Any) -> Publisher:
        """The Kafka publisher, to ``settings``' broker or by default the configured Kafka: one instance of the
        publish group, owning its fair share of the ``COMMITLINE_PUBLISH_BUCKETS`` buckets. Without a
        configured Kafka it publishes to an embedded broker only when the database is embedded too (the
        demo setup, where both vanish together); with a configured database it raises ConfigurationError
        naming KAFKA_BOOTSTRAP_SERVERS, since positions saved for a broker that vanishes with the process
        would make a real Kafka configured later never receive those events."""
        if settings is None:
            if self.settings.kafka_bootstrap_servers is None and self.settings.database_url is not None:
                raise ConfigurationError(
                    "KAFKA_BOOTSTRAP_SERVERS",
                    "is not set, and COMMITLINE_DATABASE_URL names a real database: refusing to publish its events "
                    "to a throwaway embedded broker (their position would be saved and a real Kafka would never "
                    "get them). Set KAFKA_BOOTSTRAP_SERVERS to the Kafka cluster to publish to")
            settings = self.start_embedded_kafka_if_unset()
            options.setdefault("broker_in_memory", self.settings.kafka_bootstrap_servers is None)
        client_options(settings)  # a TLS file that cannot be loaded is refused now, not once publishing starts
        options.setdefault("tracing", self.tracing)
        return Publisher(self.recorder, self.conninfo, settings, self.domain.registry, **options)

    def projector(self, name: str, **options: Any) -> Projector:
        options.setdefault("batch_size", self.settings.project_batch_size)
        return Projector(self.projection(name), self.codec, self.recorder, self.conninfo, **options)

    def projectors(self, names: Iterable[str] = (), **options: Any) -> list[Projector]:
        return [self.projector(name, **options) for name in (list(names) or sorted(self.domain.projections))]

    def projection(self, name: str) -> Projection:
        known = self.domain.projections
        if name not in known:
            raise UnknownProjection([name], known)
        return known[name]()

    def rebuild(self, name: str, *, batch_size: int | None = None, progress: Progress | None = None,
                skip: dict[int, str] | None = None) -> RebuildResult:
        """Rebuild projection ``name``; ``skip``: poison positions to pass with the operator's reason."""
        return rebuild(self.projection(name), self.codec, self.recorder, self.conninfo,
                       batch_size=batch_size or self.settings.project_batch_size, progress=progress, skip=skip)

    def rebuild_many(self, names: Iterable[str], *, batch_size: int | None = None,
                     progress: Progress | None = None) -> list[RebuildResult]:
        """Rebuild the named projections (all, if none are named), reading the log once for all of them."""
        projections = [self.projection(name) for name in (list(names) or sorted(self.domain.projections))]
        return rebuild_many(projections, self.codec, self.recorder, self.conninfo,
                            batch_size=batch_size or self.settings.project_batch_size, progress=progress)

    def abort_rebuild(self, name: str) -> bool:
        """Discard an abandoned rebuild of ``name``; False if there was none."""
        return abort_rebuild(self.projection(name), self.recorder, self.conninfo)

    def port(self, name: str) -> Any:
        """The adapter of the domain's port ``name``, made by its factory now (ConfigurationError if it cannot)."""
        factories = self.domain.port_factories
        if name not in factories:
            raise ConfigurationError("COMMITLINE_APP", f"the domain {self.domain.name} declares no port {name!r} "
                                     f"(it has: {', '.join(sorted(factories)) or 'none'})")
        return factories[name](PortContext(self.settings, self.conninfo))

    def process_manager(self, name: str | None = None, *, ports: Mapping[str, Any] | None = None,
                        **options: Any) -> ProcessManager:
        """The domain's process manager ``name`` (the only one when None) over this processor and store. Each
        port it has no adapter for in ``ports`` is made by the domain's factory; ``attempts`` and ``backoff``
        default to ``COMMITLINE_GATEWAY_ATTEMPTS`` and ``COMMITLINE_GATEWAY_BACKOFF_MS``."""
        cls = self._manager_class(name)
        given = dict(ports or {})
        adapters = {port: given.pop(port) if port in given else self.port(port) for port in self.domain.port_factories}
        adapters.update(given)
        options.setdefault("attempts", self.settings.gateway_attempts)
        options.setdefault("backoff", self.settings.gateway_backoff_ms / 1000)
        return cls(self.processor, self.store, adapters, **options)

    def process_runner(self, manager: ProcessManager | str | None = None, **options: Any) -> ProcessRunner:
        """The follower that runs ``manager`` (an instance, or the name of one to build) over the log."""
        if not isinstance(manager, ProcessManager):
            manager = self.process_manager(manager)
        return ProcessRunner(manager, self.codec, self.recorder, self.conninfo, **options)

    def _manager_class(self, name: str | None) -> type[ProcessManager]:
        managers = self.domain.managers
        if not managers:
            raise UnknownProcessManager(name or "", managers, self.domain.name)
        if name is None and len(managers) == 1:
            return next(iter(managers.values()))
        if name is None or name not in managers:
            raise UnknownProcessManager(name or "", managers)
        return managers[name]

    def _manager_base(self, cls: type[ProcessManager] = ProcessManager) -> ProcessManager:
        """A process manager without ports: enough for what the CLI and status ask of it (``stuck``,
        ``instances``, ``retry``, ``history_of``), which never calls an external system."""
        return cls(self.processor, self.store)

    @contextmanager
    def background(self, *followers: Any) -> Iterator[list[FollowerThread]]:
        """Run followers (or functions making them: ``app.projector``, ``app.publisher``) in threads of
        their own while the block runs; they stop at its end. For programs that are not asyncio."""
        threads = [FollowerThread(f if callable(f) and not hasattr(f, "run") else (lambda f=f: f))
                   for f in followers]
        started: list[FollowerThread] = []
        try:
            for thread in threads:
                started.append(thread.start())
            yield started
        finally:
            for thread in reversed(started):
                thread.stop()

    def published(self, expect_at_least: int, *, timeout: float = 60, quiet_for: float = 1.0,
                  settings: Settings | None = None) -> list[ConsumedRecord]:
        """Every record published to the domain's topics, read back from the broker (``settings``' broker, by
        default the configured one): forensics and demonstrations."""
        settings = settings or self.settings
        if settings.kafka_bootstrap_servers is None:
            raise ConfigurationError("KAFKA_BOOTSTRAP_SERVERS", "is not set: there is no broker to read from")
        return read_topics(settings.kafka_bootstrap_servers, settings.kafka_topic_prefix or "", expect_at_least,
                           timeout, quiet_for, aggregate_types=self.domain.registry.aggregate_types)

    def run_until_signalled(self, *followers: Follower, drain: bool = False) -> None:
        """Run the followers until SIGINT or SIGTERM (or, with ``drain``, until each has caught up or stopped
        at a poison event: its ``waiting_for_operator`` says which)."""

        async def run() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            self.liveness.attach(loop)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if drain:
                behind = set(followers)

                def caught_up(follower: Follower) -> None:
                    behind.discard(follower)
                    if not behind:
                        stop.set()

                for follower in followers:  # one stopped at a poison event cannot catch up: it is done too
                    follower.on_caught_up = follower.on_poisoned = lambda f=follower: caught_up(f)
            try:
                await asyncio.gather(*(f.run(stop) for f in followers))
            finally:
                self.liveness.detach()

        asyncio.run(run())

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.tracing is not None:  # the spans of a one-shot command leave before it exits
            self.tracing.flush()
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


def connection_parts(settings: Settings) -> tuple[dict[str, Any], SharedServer[EmbeddedPostgres] | None]:
    """The configured database, or else the data folder's embedded PostgreSQL (started, or reused when
    another process already runs it)."""
    if settings.database_url is not None:
        return settings.connection_parts(), None
    shared = shared_postgres(settings.data_dir)
    try:
        embedded = shared.acquire()
    except EmbeddedServiceError as e:
        raise ConfigurationError("COMMITLINE_DATA_DIR", str(e)) from None
    log.info("%s embedded PostgreSQL at %s", "started" if shared.started_here else "using the running",
             embedded.dsn)
    return Settings(database_url=embedded.dsn).connection_parts(), shared


def bootstrap(settings: Settings | None = None, *, domain: Domain | str | None = None, apply_migrations: bool = True,
              dispatch_cpu: str = "off") -> Commitline:
    """Wire ``domain`` (a ``Domain``, or its ``module:attribute``; default ``COMMITLINE_APP``, else the built-in
    examples) to ``settings`` (default: the environment), bringing the schema up to date first unless
    ``apply_migrations`` is False (``commitline migrate --check``). The domain is checked before anything is
    written (``InvalidDomain``, ``InvalidApp``). ``dispatch_cpu`` applies when ``COMMITLINE_DISPATCH_CPU`` is
    unset: ``auto`` in commitline's own server and CLI processes."""
    settings = settings or load_settings()
    if settings.log_level is not None:  # else the program's own logging decides (the CLI: by command)
        logging.getLogger().setLevel(settings.log_level)
    if isinstance(domain, Domain):
        domain = domain.check()
    elif domain is not None:
        domain = load_domain(domain, variable="bootstrap(domain=...)")
    else:
        domain = load_domain(settings.app)
    settings = settings.for_domain(domain.schema)
    tracing = tracing_for(settings)  # a protocol it cannot export fails before any I/O
    cpu = DispatchCpu.from_setting(settings.dispatch_cpu or dispatch_cpu)  # a bad value fails before any I/O
    try:
        parts, shared = connection_parts(settings)
    except BaseException:
        cpu.close()
        raise
    try:
        # One direct connection first: an unreachable server fails in milliseconds here,
        # where the pool would keep retrying until its timeout.
        with psycopg.connect(**connect_options(parts, connect_timeout=10), autocommit=True) as conn:
            if apply_migrations:  # one cheap read when the schema is current; never DDL on hot tables then
                migrations.migrate(conn, settings.schema_name)
        datastore = StoreDatastore(
            parts["dbname"], parts["host"], parts["port"], parts["user"], parts["password"],
            pool_size=settings.pool_size,
            max_overflow=settings.pool_max_overflow,
            schema=settings.schema_name,
            pool_timeout=settings.pool_timeout_s,
            libpq=parts,  # sslmode, application_name, options, ...: every parameter of the URL
        )
        datastore.pool.open(wait=True, timeout=15)
        recorder = EventRecorder(datastore)
        with datastore.get_connection() as conn:
            stored = event_versions.stored_pairs(conn, settings.schema_name)
    except Exception as e:
        cpu.close()
        if shared is not None:
            shared.release()
        raise StoreUnavailable(describe_failure(e, parts)) from None
    unreadable = stored_problems(domain, stored, settings.schema_name)
    if unreadable:  # before this process writes or publishes anything
        datastore.close()
        cpu.close()
        if shared is not None:
            shared.release()
        variable, spec = domain.loaded_as
        raise InvalidDomain(variable, domain.name, unreadable, spec)
    store = PostgresEventStore(recorder, EventCodec(domain.registry), settings.snapshot_interval,
                               max_event_bytes=settings.max_event_bytes, cache_size=settings.aggregate_cache_size,
                               group_commit=settings.group_commit_max,
                               versions=EventVersions(datastore.get_connection, settings.schema_name, stored),
                               tracing=tracing)
    retry = RetryPolicy(
        settings.retry_max_attempts, settings.retry_base_delay_ms / 1000, settings.retry_max_delay_ms / 1000
    )
    processor = CommandProcessor(store, domain.catalog, retry, settings.command_limits(), CommandMetrics(), cpu.enter,
                                 tracing)
    return Commitline(settings, datastore, recorder, store, processor, parts, shared.instance if shared else None,
                      shared_postgres=shared, dispatch_cpu=cpu, domain=domain, tracing=tracing)
