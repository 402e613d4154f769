"""The composition root: settings -> database (configured or embedded) -> store -> every runnable.

``bootstrap()`` returns a ``Commitline`` that builds, from one configuration, everything a
program runs: the command processor, the Kafka publisher, the projectors, the fulfilment
saga and its runner, the auditor, the read models, rebuilds and the status report, and
``run_until_signalled`` to run followers until SIGINT/SIGTERM. The CLI, the demo, the
tests and the benchmarks only call it and render what it returns.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from commitline.application.audit import Auditor
from commitline.application.errors import ConfigurationError, StoreUnavailable
from commitline.application.fulfilment import FulfilmentSaga
from commitline.application.payment_gateway import PaymentGateway
from commitline.application.processor import CommandProcessor
from commitline.application.retry import RetryPolicy
from commitline.domain import AGGREGATE_TYPES
from commitline.infrastructure import migrations
from commitline.infrastructure.config import Settings, load_settings
from commitline.infrastructure.dispatch_cpu import DispatchCpu
from commitline.infrastructure.embedded.kafka import EmbeddedKafka
from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.local import RunningBroker, shared_kafka, shared_postgres
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.embedded.shared import SharedServer
from commitline.infrastructure.followers.engine import Follower
from commitline.infrastructure.followers.buckets import parse_bucket_name
from commitline.infrastructure.followers.group_status import GroupStatus, group_status
from commitline.infrastructure.followers.health import (
    Problem,
    StuckSaga,
    Thresholds,
    bucket_reasons,
    follower_reasons,
    judge,
)
from commitline.infrastructure.followers.status import FollowerStatus, follower_statuses
from commitline.infrastructure.kafka.producer import client_options
from commitline.infrastructure.kafka.partitioned import UNOWNED_GRACE_SECONDS, PartitionedPublisher
from commitline.infrastructure.kafka.publisher import PUBLISHER
from commitline.infrastructure.metrics import CommandMetrics
from commitline.infrastructure.sagas.gateways import GatewayContext, load_gateway
from commitline.infrastructure.sagas.runner import RUNNER, FulfilmentRunner
from commitline.infrastructure.sagas.simulated_gateway import SimulatedGateway
from commitline.infrastructure.store.api_keys import ApiKeys
from commitline.infrastructure.store.audit_source import PostgresAuditSource
from commitline.infrastructure.store.datastore import StoreDatastore, connect_options, describe_failure
from commitline.infrastructure.store.event_store import PostgresEventStore, stored_tenant
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.projections import PROJECTIONS, ReadModels
from commitline.projections.projector import Projector
from commitline.projections.queries import FulfilmentRow
from commitline.projections.rebuild import Progress, RebuildResult, rebuild, rebuild_many
from commitline.projections.rebuild import abort as abort_rebuild
from commitline.projections.storage import table_exists

log = logging.getLogger(__name__)


class UnknownProjection(LookupError):
    def __init__(self, unknown: Iterable[str]):
        super().__init__(f"unknown projection(s) {', '.join(unknown)}; known: {', '.join(sorted(PROJECTIONS))}")


class UnknownFollower(LookupError):
    def __init__(self, unknown: Iterable[str], known: Iterable[str]):
        super().__init__(f"unknown follower(s) {', '.join(unknown)}; known: {', '.join(known)} "
                         f"(aliases: {', '.join(FOLLOWER_ALIASES)})")


FOLLOWER_ALIASES = {"publisher": PUBLISHER, "sagas": RUNNER}


@dataclass(frozen=True)
class StatusReport:
    """Every known follower (never-run ones too) with its liveness from PostgreSQL, the STUCK sagas,
    and the lag thresholds ``problems()`` judges by (``followers/health.py``)."""

    head: int
    followers: list[FollowerStatus]
    stuck_fulfilments: list[FulfilmentRow]
    thresholds: Thresholds
    publisher: GroupStatus | None = None  # the publish instances and their buckets

    def follower_names(self, names: Iterable[str]) -> list[str]:
        """``names`` (or an alias: publisher, sagas) as follower names; UnknownFollower names any other."""
        names, known = list(names), [s.name for s in self.followers]
        resolved = [FOLLOWER_ALIASES.get(n, n) for n in names]
        unknown = [n for n, r in zip(names, resolved) if r not in known]
        if unknown:
            raise UnknownFollower(unknown, known)
        return resolved

    def problems(self, only: Collection[str] | None = None) -> list[Problem]:
        """What is unhealthy: among all followers, or only those in ``only`` (which must then be running)."""
        stuck = [StuckSaga(str(r.order_id), r.stuck, r.state) for r in self.stuck_fulfilments]
        problems = judge(self.followers, stuck, self.thresholds, only=only, saga_runner=RUNNER)
        if self.publisher is not None and (only is None or PUBLISHER in only):
            problems += [Problem(s.name, reason) for s in self.publisher.buckets for reason in self.bucket_reasons(s)]
        return problems

    def bucket_reasons(self, bucket: FollowerStatus) -> list[str]:
        members = len(self.publisher.members) if self.publisher is not None else 0
        return bucket_reasons(bucket, self.thresholds, members, UNOWNED_GRACE_SECONDS)

    def reasons(self, follower: FollowerStatus) -> list[str]:
        return follower_reasons(follower, self.thresholds)


@dataclass
class Commitline:
    """Everything wired together; close it to release connections and stop embedded services."""

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
    _closed: bool = field(default=False, repr=False)

    # -- commands and queries ----------------------------------------------------------

    def dispatch(self, command: Any, *, idempotency_key: str | None, tenant: str = "default"):
        return self.processor.dispatch(command, idempotency_key=idempotency_key, tenant=tenant)

    def auditor(self) -> Auditor:
        return Auditor(PostgresAuditSource(self.recorder), AGGREGATE_TYPES, stored_tenant)

    def read_models(self) -> ReadModels:
        return ReadModels(self.datastore)

    def api_keys(self) -> ApiKeys:
        return ApiKeys(self.datastore.get_connection, self.settings.schema_name)

    def unready(self) -> list[str]:
        """Why this process cannot serve now ([] when it can): the database does not answer, or its schema
        is not at the version this commitline needs."""
        try:
            with self.datastore.get_connection() as conn:
                missing = migrations.pending(conn, self.settings.schema_name)
        except migrations.SchemaTooNew as e:
            return [str(e)]
        except Exception as e:
            return [f"database unreachable: {describe_failure(e, self.conninfo)}"]
        return [f"schema {self.settings.schema_name} lacks migration {m.version} ({m.description}); "
                "run commitline migrate" for m in missing]

    def status(self) -> StatusReport:
        # The publisher's bucket rows are shown per publish instance (``publisher``), not as followers.
        head, followers = follower_statuses(self.recorder, [PUBLISHER, RUNNER, *sorted(PROJECTIONS)],
                                            include=lambda name: parse_bucket_name(name) is None)
        limits = Thresholds(self.settings.status_max_lag_events, self.settings.status_max_lag_s)
        publisher = group_status(self.recorder, PUBLISHER, self.settings.publish_buckets, head)
        return StatusReport(head, followers, self._stuck_fulfilments(), limits, publisher)

    def _stuck_fulfilments(self) -> list[FulfilmentRow]:
        with self.datastore.get_connection() as conn:
            built = table_exists(conn, self.datastore.schema, self.projection("order_fulfilments"))
        return self.read_models().fulfilments(stuck_only=True) if built else []

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

    def publisher(self, settings: Settings | None = None, **options: Any) -> PartitionedPublisher:
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
        return PartitionedPublisher(self.recorder, self.conninfo, settings, **options)

    def projector(self, name: str, **options: Any) -> Projector:
        options.setdefault("batch_size", self.settings.project_batch_size)
        return Projector(self.projection(name), self.recorder, self.conninfo, **options)

    def projectors(self, names: Iterable[str] = (), **options: Any) -> list[Projector]:
        return [self.projector(name, **options) for name in (list(names) or sorted(PROJECTIONS))]

    @staticmethod
    def projection(name: str) -> Any:
        if name not in PROJECTIONS:
            raise UnknownProjection([name])
        return PROJECTIONS[name]()

    def rebuild(self, name: str, *, batch_size: int | None = None, progress: Progress | None = None,
                skip: dict[int, str] | None = None) -> RebuildResult:
        """Rebuild projection ``name``; ``skip``: poison positions to pass with the operator's reason."""
        return rebuild(self.projection(name), self.recorder, self.conninfo,
                       batch_size=batch_size or self.settings.project_batch_size, progress=progress, skip=skip)

    def rebuild_many(self, names: Iterable[str], *, batch_size: int | None = None,
                     progress: Progress | None = None) -> list[RebuildResult]:
        """Rebuild the named projections (all, if none are named), reading the log once for all of them."""
        projections = [self.projection(name) for name in (list(names) or sorted(PROJECTIONS))]
        return rebuild_many(projections, self.recorder, self.conninfo,
                            batch_size=batch_size or self.settings.project_batch_size, progress=progress)

    def abort_rebuild(self, name: str) -> bool:
        """Discard an abandoned rebuild of ``name``; False if there was none."""
        return abort_rebuild(self.projection(name), self.recorder, self.conninfo)

    def gateway(self) -> PaymentGateway:
        """The configured payment gateway (``COMMITLINE_GATEWAY``; the simulated one by default)."""
        return load_gateway(GatewayContext(self.settings, self.conninfo))

    def simulated_gateway(self) -> SimulatedGateway:
        return SimulatedGateway(self.conninfo, self.settings.schema_name)

    def saga(self, gateway: PaymentGateway | None = None, **options: Any) -> FulfilmentSaga:
        """The fulfilment saga over ``gateway`` (default: the configured one), retrying each gateway call and
        compensation ``COMMITLINE_GATEWAY_ATTEMPTS`` times with ``COMMITLINE_GATEWAY_BACKOFF_MS`` back-off."""
        options.setdefault("attempts", self.settings.gateway_attempts)
        options.setdefault("backoff", self.settings.gateway_backoff_ms / 1000)
        return FulfilmentSaga(self.processor, self.store, gateway or self.gateway(), **options)

    def fulfilment_runner(self, saga: FulfilmentSaga | None = None, **options: Any) -> FulfilmentRunner:
        return FulfilmentRunner(saga or self.saga(), self.recorder, self.conninfo, **options)

    def run_until_signalled(self, *followers: Follower, drain: bool = False) -> None:
        """Run the followers until SIGINT or SIGTERM (or, with ``drain``, until each has caught up or stopped
        at a poison event: its ``waiting_for_operator`` says which)."""

        async def run() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
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
            await asyncio.gather(*(f.run(stop) for f in followers))

        asyncio.run(run())

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
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


def bootstrap(settings: Settings | None = None, *, apply_migrations: bool = True,
              dispatch_cpu: str = "off") -> Commitline:
    """Wire everything from ``settings`` (default: the environment), bringing the schema up to date
    first unless ``apply_migrations`` is False (``commitline migrate --check``). ``dispatch_cpu`` applies
    when ``COMMITLINE_DISPATCH_CPU`` is unset: ``auto`` in commitline's own server and CLI processes."""
    settings = settings or load_settings()
    logging.getLogger().setLevel(settings.log_level)
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
    except Exception as e:
        cpu.close()
        if shared is not None:
            shared.release()
        raise StoreUnavailable(describe_failure(e, parts)) from None
    store = PostgresEventStore(recorder, settings.snapshot_interval, max_event_bytes=settings.max_event_bytes,
                               cache_size=settings.aggregate_cache_size, group_commit=settings.group_commit_max)
    retry = RetryPolicy(
        settings.retry_max_attempts, settings.retry_base_delay_ms / 1000, settings.retry_max_delay_ms / 1000
    )
    processor = CommandProcessor(store, retry, settings.command_limits(), CommandMetrics(), cpu.enter)
    return Commitline(settings, datastore, recorder, store, processor,
                      parts, shared.instance if shared else None, shared_postgres=shared, dispatch_cpu=cpu)
