"""``bootstrap()``: settings and a domain wired to a database (configured, or the data folder's embedded
PostgreSQL), a checked and migrated schema, the store and the command processor, as one ``Commitline``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg

from commitline.application.errors import ConfigurationError, InvalidDomain, StoreUnavailable
from commitline.application.processor import CommandProcessor
from commitline.application.retry import RetryPolicy
from commitline.composition.root import Commitline
from commitline.framework.checks import column_type_problems, stored_problems
from commitline.framework.domain import Domain
from commitline.framework.loading import load_domain
from commitline.infrastructure import migrations
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
            created = False
            if apply_migrations:  # one cheap read when the schema is current; never DDL on hot tables then
                created = any(m.version == 1 for m in migrations.migrate(conn, settings.schema_name))
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
            unknown = unknown_types(conn, domain.projections.values())
    except Exception as e:
        cpu.close()
        if shared is not None:
            shared.release()
        if isinstance(e, ConfigurationError):  # the database answered: the store is not one this code may use
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
                      shared_postgres=shared, dispatch_cpu=cpu, domain=domain, tracing=tracing, created_store=created)
