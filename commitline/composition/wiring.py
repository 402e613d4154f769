"""``bootstrap()``: settings and a domain wired to a database (configured, or the data folder's embedded
PostgreSQL), a checked and migrated schema, the store and the command processor, as one ``Commitline``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from commitline.application.errors import ConfigurationError, InvalidDomain, StoreUnavailable
from commitline.application.processor import CommandProcessor
from commitline.application.retry import RetryPolicy
from commitline.composition.root import Commitline
from commitline.framework.checks import column_type_problems, stored_problems
from commitline.framework.domain import Domain
from commitline.framework.loading import load_domain
from commitline.infrastructure import migrations
from commitline.infrastructure.migrations import NoStore
from commitline.infrastructure.config import Settings, load_settings
from commitline.infrastructure.dispatch_cpu import DispatchCpu
from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.local import shared_postgres
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.embedded.shared import SharedServer
from commitline.infrastructure.metrics import CommandMetrics
from commitline.infrastructure.personal.cipher import PersonalData
from commitline.infrastructure.personal.erasure_watch import ErasureWatch
from commitline.infrastructure.personal.keys import DataKeys
from commitline.infrastructure.personal.master import VARIABLE, MasterKey, development_key
from commitline.infrastructure.store import event_versions
from commitline.infrastructure.store.codec import EventCodec
from commitline.infrastructure.store.datastore import StoreDatastore, connect_options, describe_failure
from commitline.infrastructure.store.event_store import PostgresEventStore
from commitline.infrastructure.store.event_versions import EventVersions
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.infrastructure.tracing import tracing_for
from commitline.projections.storage import unknown_types

log = logging.getLogger(__name__)


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


def master_key_source(settings: Settings) -> Callable[[], MasterKey]:
    """Where the master key comes from: ``COMMITLINE_MASTER_KEY``; else, with the embedded PostgreSQL, the data
    folder's development key; else nowhere, which fails (``ConfigurationError``) when a personal field is first
    written or read, before anything is written."""
    if settings.master_key is not None:
        key = MasterKey.parse(settings.master_key.get_secret_value())  # validated by Settings already
        return lambda: key
    if settings.database_url is None:
        return lambda: development_key(settings.data_dir)

    def missing() -> MasterKey:
        raise ConfigurationError(VARIABLE, "is not set, and the domain's personal fields are encrypted under it: set "
                                 "it to the base64 of 32 random bytes (`openssl rand -base64 32`); nothing was written")

    return missing


class _LastConnectError(logging.Handler):
    """The last connection error the pool's workers logged (they retry it; the pool's timeout does not say it)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("error connecting"):  # ("error connecting in %r: %s", name, error)
            self.message = str(record.args[-1]) if isinstance(record.args, tuple) and record.args else \
                record.getMessage()


@contextmanager
def told_pool_failures(parts: dict[str, Any], timeout_s: float) -> Iterator[Callable[[StoreDatastore], None]]:
    """``open_pool(datastore)``, for a datastore made in the block: fill the pool's kept connections, waiting at
    most ``timeout_s`` (``COMMITLINE_POOL_TIMEOUT_S``, at least 5 s: a loaded machine opens connections slowly);
    StoreUnavailable if it does not fill, with what the server last answered a connection of the pool (too many
    connections, say), which the pool's workers only log (from the moment the datastore makes the pool) and its
    timeout does not name."""
    pool_log = logging.getLogger("psycopg.pool")
    last = _LastConnectError()
    # eventsourcing sets this logger to ERROR: heard here alone meanwhile, its retries are not printed
    level, propagate = pool_log.level, pool_log.propagate
    pool_log.setLevel(logging.WARNING)
    pool_log.propagate = False
    pool_log.addHandler(last)

    def open_pool(datastore: StoreDatastore) -> None:
        try:
            datastore.pool.open(wait=True, timeout=max(timeout_s, 5.0))
        except PoolTimeout as e:
            datastore.close()
            cause = f"; the server answered its last connection: {last.message}" if last.message else ""
            text = (describe_failure(e, parts) + f" (the pool keeps {datastore.pool.min_size} connections open: "
                    "COMMITLINE_POOL_SIZE; the server may allow fewer, its max_connections or a CONNECTION LIMIT)"
                    + cause)
            if parts.get("password"):
                text = text.replace(str(parts["password"]), "***")
            raise StoreUnavailable(text) from None

    try:
        yield open_pool
    finally:
        pool_log.removeHandler(last)
        pool_log.setLevel(level)
        pool_log.propagate = propagate


def bootstrap(settings: Settings | None = None, *, domain: Domain | str | None = None, apply_migrations: bool = True,
              dispatch_cpu: str = "off", create_store: bool = True) -> Commitline:
    """Wire ``domain`` (a ``Domain``, or its ``module:attribute``; default ``COMMITLINE_APP``, else the built-in
    examples) to ``settings`` (default: the environment), bringing the schema up to date first unless
    ``apply_migrations`` is False (``commitline migrate --check``). With ``create_store`` False, a schema that
    holds no store is refused (``NoStore``) instead of given an empty one: for commands that only read, where
    a mistyped schema must not pass for an empty store. The domain is checked before anything is
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
            created = False
            if not create_store and migrations.schema_version(conn, settings.schema_name) == 0:
                raise NoStore(reason=f"schema {settings.schema_name} holds no commitline store (is it, or the "
                              "database, the one you meant? `commitline migrate` makes an empty one); nothing was "
                              "made")
            if apply_migrations:  # one cheap read when the schema is current; never DDL on hot tables then
                created = any(m.version == 1 for m in migrations.migrate(conn, settings.schema_name))
        with told_pool_failures(parts, settings.pool_timeout_s) as open_pool:
            datastore = StoreDatastore(
                parts["dbname"], parts["host"], parts["port"], parts["user"], parts["password"],
                pool_size=settings.pool_size,
                max_overflow=settings.pool_max_overflow,
                schema=settings.schema_name,
                pool_timeout=settings.pool_timeout_s,
                libpq=parts,  # sslmode, application_name, options, ...: every parameter of the URL
            )
            open_pool(datastore)
        recorder = EventRecorder(datastore)
        with datastore.get_connection() as conn:
            stored = event_versions.stored_pairs(conn, settings.schema_name)
            unknown = unknown_types(conn, domain.projections.values())
    except Exception as e:
        cpu.close()
        if shared is not None:
            shared.release()
        if isinstance(e, (ConfigurationError, StoreUnavailable)):  # the database answered, or the cause is told
            raise
        raise StoreUnavailable(describe_failure(e, parts)) from None
    unreadable = stored_problems(domain, stored, settings.schema_name) + column_type_problems(domain, unknown)
    if unreadable:  # before this process writes or publishes anything
        datastore.close()
        cpu.close()
        if shared is not None:
            shared.release()
        variable, spec = domain.loaded_as
        raise InvalidDomain(variable, domain.name, unreadable, spec)
    previous = settings.previous_master_key
    keys = DataKeys(datastore.get_connection, settings.schema_name)
    personal = PersonalData(keys, master_key_source(settings), ttl_s=settings.data_key_ttl_s,
                            previous=MasterKey.parse(previous.get_secret_value()) if previous is not None else None)
    store = PostgresEventStore(recorder, EventCodec(domain.registry, personal), settings.snapshot_interval,
                               max_event_bytes=settings.max_event_bytes, cache_size=settings.aggregate_cache_size,
                               group_commit=settings.group_commit_max,
                               versions=EventVersions(datastore.get_connection, settings.schema_name, stored),
                               tracing=tracing)
    # Other processes' erasures reach this one as soon as it holds a data key.
    personal.watch = ErasureWatch(parts, keys.channel, store.forget, store.forget_all,
                                 lambda: datastore.connections_lost)
    retry = RetryPolicy(
        settings.retry_max_attempts, settings.retry_base_delay_ms / 1000, settings.retry_max_delay_ms / 1000
    )
    processor = CommandProcessor(store, domain.catalog, retry, settings.command_limits(), CommandMetrics(), cpu.enter,
                                 tracing)
    return Commitline(settings, datastore, recorder, store, processor, parts, shared.instance if shared else None,
                      shared_postgres=shared, dispatch_cpu=cpu, domain=domain, tracing=tracing, created_store=created,
                      reopen=lambda: bootstrap(settings, domain=domain, apply_migrations=False))
