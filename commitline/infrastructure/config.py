"""Configuration from environment variables, validated once at start.

Each ``Settings`` field declares its variable (``validation_alias``), default and meaning (the
docstring under it, pydantic's ``description``) once; ``python -m commitline.infrastructure.config``
prints the configuration reference's table from them (docs/reference/configuration.md). ``Settings(...)`` takes field names and reads nothing else; only
``load_settings`` reads the environment. A bad value raises ConfigurationError naming the
variable and what is wrong; secrets are never echoed in errors, logs or ``repr``.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args

from psycopg.conninfo import conninfo_to_dict
from pydantic import Field, FilePath, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from commitline.application.boundary import CommandLimits
from commitline.application.errors import ConfigurationError
from commitline.infrastructure.schema_names import SCHEMA_PATTERN, schema_name_problem

# Read by the test suite and the benchmarks, not by commitline: documented beside the settings.
TOOLING_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("COMMITLINE_TEST_DSN", "unset: embedded", "tests only: run the suite against this PostgreSQL instead"),
    ("COMMITLINE_BENCH_DSN", "unset: embedded", "benchmarks only: measure against this PostgreSQL instead"),
    ("COMMITLINE_TEST_OUTAGE_S", "`120`", "tests only: how long the fleet outage test keeps PostgreSQL stopped, "
     "in seconds (shorten it while developing)"),
)

#: libpq parameters every connection gets unless the URL sets them: a connection whose server vanished without
#: closing it (a partition, a failed-over host) fails within about 30 s instead of TCP's 15 minutes, both while
#: it waits for an answer (keepalives: 10 s idle, then 3 probes 5 s apart) and while what it sent is not
#: acknowledged (tcp_user_timeout, ms). A request on it then fails with ``StoreUnavailable``, and the pool replaces it.
TCP_LIVENESS: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                                "keepalives_count": 3, "tcp_user_timeout": 30_000}

DISPATCH_CPU_VALUES = r"^(off|auto|\d{1,5})$"  # COMMITLINE_DISPATCH_CPU (infrastructure.dispatch_cpu)


#: libpq connection parameters whose values are a fixed set (https://www.postgresql.org/docs/current/libpq-connect.html)
_LIBPQ_CHOICES: dict[str, tuple[str, ...]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
}


_BROKER_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
"""A broker's host in KAFKA_BOOTSTRAP_SERVERS: a host name, an IPv4 address or an IPv6 address in brackets."""


_UNKNOWN_PARAMETER = re.compile(r'invalid URI query parameter: "([A-Za-z_][A-Za-z0-9_]{0,63})"')


def _url_problem(libpq: str) -> str:
    """What libpq found wrong with a connection URL, said without repeating any part of it that may be secret
    (libpq quotes the offending text: a password with a stray ``%``, say); empty when it is not known."""
    if (unknown := _UNKNOWN_PARAMETER.search(libpq)) is not None:
        return f": it has the query parameter {unknown.group(1)!r}, which libpq does not know"
    if "percent-encoded" in libpq:
        return ": a '%' in it is not followed by two hexadecimal digits (write a '%' in a password as %25)"
    if "key/value separator" in libpq:
        return ": one of its query parameters has no '=value'"
    if "IPv6" in libpq:
        return ": an IPv6 host address opened with '[' is not closed with ']'"
    if "connection info string" in libpq:
        return ": it is neither a postgresql:// URL nor space-separated key=value pairs"
    return ""


class Settings(BaseSettings):
    # Code sets fields by name (``pool_size=4``), the environment by variable (``COMMITLINE_POOL_SIZE``).
    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True, use_attribute_docstrings=True,
        case_sensitive=True, env_ignore_empty=True,
    )

    database_url: SecretStr | None = Field(None, validation_alias="COMMITLINE_DATABASE_URL",
                                           json_schema_extra={"unset": "embedded PostgreSQL"})
    """PostgreSQL URL, e.g. `postgresql://user:pw@host/db?sslmode=verify-full`; all its libpq parameters apply (secret)"""
    master_key: SecretStr | None = Field(None, validation_alias="COMMITLINE_MASTER_KEY",
                                         json_schema_extra={"unset": "with the embedded PostgreSQL, a development "
                                                            "key kept in `COMMITLINE_DATA_DIR`; with a configured "
                                                            "database, personal fields cannot be written or read"})
    """base64 of 32 random bytes (`openssl rand -base64 32`): the master key wrapping each data subject's data key, which encrypts the domain's personal fields; its id is derived from it; rotated with `commitline keys rotate` (secret: never printed)"""
    previous_master_key: SecretStr | None = Field(None, validation_alias="COMMITLINE_PREVIOUS_MASTER_KEY",
                                                  json_schema_extra={"unset": "none: only data keys wrapped under "
                                                                     "`COMMITLINE_MASTER_KEY` are opened"})
    """during a rolling rotation, the master key before `COMMITLINE_MASTER_KEY` (same form): data keys wrapped under either are opened, new ones are wrapped under the current key only; `commitline keys rotate` then rewraps every key from this one to the current one, after which it is dropped (secret: never printed)"""
    data_key_ttl_s: float = Field(30, gt=0, le=86_400, validation_alias="COMMITLINE_DATA_KEY_TTL_S")
    """longest a process uses a data key it read without reading it again: erasures reach running processes at once by notification, and this bounds the time only while a process has lost its notification connection"""
    data_dir: Path = Field(Path(".commitline"), validation_alias="COMMITLINE_DATA_DIR")
    """folder of the local services every process using it shares: the embedded PostgreSQL's data, the broker's process and address (it keeps records in memory only)"""
    app: str | None = Field(None, validation_alias="COMMITLINE_APP",
                            json_schema_extra={"unset": "the built-in examples (`commitline.examples:domain`)"})
    """the domain every process runs, as `module:attribute` (as `--app`), e.g. `shelfwise.app:domain`; the module is imported with the working directory first on the path"""
    schema_name: str | None = Field(None, pattern=SCHEMA_PATTERN, validation_alias="COMMITLINE_SCHEMA",
                                    json_schema_extra={"unset": "the domain's schema: `commitline` for the built-in "
                                                       "examples, else the domain's name"})
    """schema holding commitline's tables"""
    pool_size: int = Field(10, ge=1, le=500, validation_alias="COMMITLINE_POOL_SIZE")
    """connections kept open"""
    pool_max_overflow: int = Field(40, ge=0, le=1000, validation_alias="COMMITLINE_POOL_MAX_OVERFLOW")
    """extra connections opened under load"""
    pool_timeout_s: float = Field(5, gt=0, le=600, validation_alias="COMMITLINE_POOL_TIMEOUT_S")
    """longest wait for a pooled connection; then the call fails with `StoreUnavailable`"""
    snapshot_interval: int = Field(10, ge=0, validation_alias="COMMITLINE_SNAPSHOT_INTERVAL")
    """snapshot every N events of a stream (0 disables): a load replays at most N-1 events; a stream keeps its latest snapshot only"""
    aggregate_cache_size: int = Field(10_000, ge=0, le=10_000_000, validation_alias="COMMITLINE_AGGREGATE_CACHE_SIZE")
    """aggregates each process keeps decoded between commands (least recently used go first; 0 disables)"""
    group_commit_max: int = Field(48, ge=0, le=60, validation_alias="COMMITLINE_GROUP_COMMIT_MAX")
    """most concurrent commands appended in one shared transaction, each atomic on its own (0: one each)"""
    retry_max_attempts: int = Field(10, ge=1, le=100, validation_alias="COMMITLINE_RETRY_MAX_ATTEMPTS")
    """attempts for a command without `expected_version` whose stream keeps moving"""
    retry_base_delay_ms: float = Field(5, ge=0, validation_alias="COMMITLINE_RETRY_BASE_DELAY_MS")
    """first back-off cap, doubled per retry (full jitter)"""
    retry_max_delay_ms: float = Field(500, ge=0, validation_alias="COMMITLINE_RETRY_MAX_DELAY_MS")
    """largest back-off"""
    log_level: str | None = Field(None, pattern=r"^(DEBUG|INFO|WARNING|ERROR)$", validation_alias="COMMITLINE_LOG_LEVEL",
                                  json_schema_extra={"unset": "`INFO` in `serve`, `publish`, `project` and `sagas run`; "
                                                     "`WARNING` in the other commands, whose output is their result "
                                                     "(stdout) or typed error (stderr); an embedding application's "
                                                     "own logging untouched"})
    """`DEBUG`, `INFO`, `WARNING` or `ERROR` (the `--log-level` option of every command sets it too)"""
    kafka_bootstrap_servers: str | None = Field(None, pattern=r"^[^,\s]+:\d+(,[^,\s]+:\d+)*$",
                                                validation_alias="KAFKA_BOOTSTRAP_SERVERS",
                                                json_schema_extra={"unset": "no publishing with a configured "
                                                                   "database; embedded Tansu broker with the "
                                                                   "embedded one"})
    """`host:port[,host:port]` of the Kafka cluster to publish to"""
    kafka_topic_prefix: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{0,200}$",
                                           validation_alias="COMMITLINE_KAFKA_TOPIC_PREFIX",
                                           json_schema_extra={"unset": "the domain's schema and a dot: `commitline.` "
                                                              "for the built-in examples"})
    """topic = prefix + aggregate type, e.g. `commitline.Order` for an aggregate named `Order`"""
    kafka_partitions: int = Field(6, ge=1, le=10_000, validation_alias="COMMITLINE_KAFKA_PARTITIONS")
    """partitions of the topics the publisher creates"""
    kafka_replication_factor: int = Field(1, ge=1, le=10, validation_alias="COMMITLINE_KAFKA_REPLICATION_FACTOR")
    """replication factor of the topics the publisher creates"""
    kafka_idempotence: bool = Field(True, validation_alias="COMMITLINE_KAFKA_IDEMPOTENCE")
    """idempotent producer; always off against the embedded broker, which cannot do it"""
    kafka_security_protocol: str = Field("PLAINTEXT", pattern=r"^(PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL)$",
                                         validation_alias="COMMITLINE_KAFKA_SECURITY_PROTOCOL")
    """`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`"""
    kafka_sasl_mechanism: str = Field("PLAIN", pattern=r"^(PLAIN|SCRAM-SHA-256|SCRAM-SHA-512)$",
                                      validation_alias="COMMITLINE_KAFKA_SASL_MECHANISM")
    """`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`"""
    kafka_username: str | None = Field(None, validation_alias="COMMITLINE_KAFKA_USERNAME")
    """SASL user name (required with `SASL_PLAINTEXT` and `SASL_SSL`, refused with the others)"""
    kafka_password: SecretStr | None = Field(None, validation_alias="COMMITLINE_KAFKA_PASSWORD")
    """SASL password, required with a SASL protocol (secret: never printed)"""
    kafka_ssl_cafile: FilePath | None = Field(None, validation_alias="COMMITLINE_KAFKA_SSL_CAFILE",
                                              json_schema_extra={"unset": "the system's CA certificates"})
    """PEM file of the CAs that sign the brokers' certificates (`SSL`, `SASL_SSL`)"""
    kafka_ssl_certfile: FilePath | None = Field(None, validation_alias="COMMITLINE_KAFKA_SSL_CERTFILE")
    """PEM client certificate for mutual TLS (may hold the key too)"""
    kafka_ssl_keyfile: FilePath | None = Field(None, validation_alias="COMMITLINE_KAFKA_SSL_KEYFILE")
    """PEM private key of the client certificate, if not in the certificate file"""
    kafka_ssl_key_password: SecretStr | None = Field(None, validation_alias="COMMITLINE_KAFKA_SSL_KEY_PASSWORD")
    """password of an encrypted client key (secret: never printed)"""
    publish_batch_size: int = Field(2000, ge=1, le=100_000, validation_alias="COMMITLINE_PUBLISH_BATCH_SIZE")
    """events read from the log per publish batch"""
    publish_poll_interval_ms: float = Field(1000, gt=0, validation_alias="COMMITLINE_PUBLISH_POLL_INTERVAL_MS")
    """longest wait for new events when no NOTIFY wake-up arrives"""
    publish_max_backoff_ms: float = Field(10_000, gt=0, validation_alias="COMMITLINE_PUBLISH_MAX_BACKOFF_MS")
    """longest pause between attempts while the broker fails"""
    publish_buckets: int = Field(16, ge=1, le=1024, validation_alias="COMMITLINE_PUBLISH_BUCKETS")
    """buckets of aggregates shared by `publish` instances, each owned by one; instances of another count wait (`status` and the metrics show the count the running instances use)"""
    project_batch_size: int = Field(5000, ge=1, le=100_000, validation_alias="COMMITLINE_PROJECT_BATCH_SIZE")
    """events applied per projection transaction (live and rebuild)"""
    metrics_interval_s: float = Field(30, gt=0, validation_alias="COMMITLINE_METRICS_INTERVAL_S")
    """how often `commitline publish` logs its metrics (events published, batches, position), as JSON"""
    status_max_lag_events: int = Field(10_000, ge=0, validation_alias="COMMITLINE_STATUS_MAX_LAG_EVENTS")
    """`status --check` fails when a live follower is more events than this behind the log head"""
    status_max_lag_s: float = Field(60, ge=0, validation_alias="COMMITLINE_STATUS_MAX_LAG_S")
    """`status --check` fails when a live follower's oldest unhandled event is older than this, in seconds"""
    max_event_bytes: int = Field(900_000, ge=300_000, le=64 * 1024 * 1024,
                                 validation_alias="COMMITLINE_MAX_EVENT_BYTES")
    """largest stored event in bytes (at least 300000); a larger one is refused with `EventTooLarge`"""
    kafka_max_message_bytes: int = Field(1_048_588, ge=1024, le=2**31 - 1,
                                         validation_alias="COMMITLINE_KAFKA_MAX_MESSAGE_BYTES")
    """the broker's `message.max.bytes`: the publisher stops at a larger record for `commitline publisher skip`/`retry`"""
    max_command_bytes: int = Field(CommandLimits.max_bytes, ge=1024, le=2**30,
                                   validation_alias="COMMITLINE_MAX_COMMAND_BYTES")
    """largest command accepted, in bytes of JSON (also a stdin line of `commitline dispatch`)"""
    max_string_length: int = Field(CommandLimits.max_string_length, ge=1, le=2**24,
                                   validation_alias="COMMITLINE_MAX_STRING_LENGTH")
    """longest string in a command, in characters (fields have their own lower limits)"""
    max_list_length: int = Field(CommandLimits.max_list_length, ge=1, le=2**24,
                                 validation_alias="COMMITLINE_MAX_LIST_LENGTH")
    """longest list in a command (the examples' `issue_survey_task` takes up to 100,000 users)"""
    max_nesting_depth: int = Field(CommandLimits.max_depth, ge=2, le=100, validation_alias="COMMITLINE_MAX_NESTING_DEPTH")
    """deepest nesting of objects and lists in a command, the command itself being level 1"""
    gateway: str = Field("simulated", pattern=r"^(simulated|http|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$",
                         validation_alias="COMMITLINE_GATEWAY")
    """the adapter behind a process manager's port (the examples' payment gateway): `simulated` (demo, ledger in PostgreSQL), `http` (the HTTP adapter, see `COMMITLINE_GATEWAY_URL`) or `module:factory`, a function taking a `PortContext` and returning the adapter"""
    gateway_url: str | None = Field(None, pattern=r"^https?://[^\s]+$", validation_alias="COMMITLINE_GATEWAY_URL")
    """base URL of the HTTP payment gateway (`COMMITLINE_GATEWAY=http`), e.g. `https://payments.internal/gw`"""
    gateway_token: SecretStr | None = Field(None, validation_alias="COMMITLINE_GATEWAY_TOKEN")
    """bearer token sent to the HTTP payment gateway (secret: never printed)"""
    gateway_timeout_s: float = Field(10, gt=0, le=300, validation_alias="COMMITLINE_GATEWAY_TIMEOUT_S")
    """longest wait for one gateway call, its whole answer included; no whole answer by then counts as an unknown outcome, retried under the same key"""
    gateway_attempts: int = Field(5, ge=1, le=100, validation_alias="COMMITLINE_GATEWAY_ATTEMPTS")
    """attempts of a gateway call (and of a compensation) before the saga gives up on it"""
    gateway_backoff_ms: float = Field(200, ge=0, le=600_000, validation_alias="COMMITLINE_GATEWAY_BACKOFF_MS")
    """pause after a failed gateway call, doubled per retry"""
    dispatch_cpu: str | None = Field(None, pattern=DISPATCH_CPU_VALUES, validation_alias="COMMITLINE_DISPATCH_CPU",
                                     json_schema_extra={"unset": "`auto` in `commitline serve` and `commitline "
                                                        "dispatch`, `off` in an application that embeds commitline"})
    """`off`, `auto` or a CPU number: the one CPU every thread that dispatches commands moves to at its first one (the interpreter runs one thread at a time; hand-overs between cores cost nearly half the throughput); `auto` claims a CPU no other commitline process on the machine has"""
    http_host: str = Field("127.0.0.1", min_length=1, validation_alias="COMMITLINE_HTTP_HOST")
    """address `commitline serve` listens on (`0.0.0.0` for every interface)"""
    http_port: int = Field(8080, ge=0, le=65535, validation_alias="COMMITLINE_HTTP_PORT")
    """port `commitline serve` listens on"""
    http_workers: int = Field(1, ge=1, le=64, validation_alias="COMMITLINE_HTTP_WORKERS")
    """worker processes of `commitline serve`, sharing one database"""
    http_operator_port: int | None = Field(None, ge=1, le=65535, validation_alias="COMMITLINE_HTTP_OPERATOR_PORT",
                                           json_schema_extra={"unset": "the operators' views on the API's port"})
    """a port of its own for the operators' views (the status page, `/v1/status`, `/metrics`), which need no API key and show every tenant's followers and stuck sagas: `commitline serve` then answers them only there, and 404 on the API's port"""
    http_operator_host: str = Field("127.0.0.1", min_length=1, validation_alias="COMMITLINE_HTTP_OPERATOR_HOST")
    """address the operators' port listens on"""
    http_max_body_bytes: int = Field(CommandLimits.max_bytes, ge=1024, le=2**30,
                                     validation_alias="COMMITLINE_HTTP_MAX_BODY_BYTES")
    """largest request body the HTTP API reads; a larger one is answered 413 unread"""
    api_key_cache_s: float = Field(60, ge=0, le=86_400, validation_alias="COMMITLINE_API_KEY_CACHE_S")
    """longest a serving process uses an API key it read without reading it again; a revocation reaches every process at once by notification (each holds one listening connection), and `0` reads the key on every request"""
    otel_traces_exporter: str | None = Field(None, pattern=r"^(otlp|console|none)$",
                                             validation_alias="OTEL_TRACES_EXPORTER",
                                             json_schema_extra={"unset": "`otlp` when an OTLP endpoint is set, "
                                                                "else no tracing"})
    """OpenTelemetry traces (HTTP request, dispatch, append, group-commit batch, publish): `otlp` (OTLP over HTTP), `console` (stdout) or `none`"""
    otel_exporter_otlp_endpoint: str | None = Field(None, pattern=r"^https?://\S+$",
                                                    validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
                                                    json_schema_extra={"unset": "`http://localhost:4318` once "
                                                                       "tracing is on"})
    """base URL of the OTLP/HTTP collector (spans go to `<url>/v1/traces`); setting it turns tracing on. Its headers (`OTEL_EXPORTER_OTLP_HEADERS`), timeout and TLS variables are read by the exporter itself, never logged"""
    otel_exporter_otlp_traces_endpoint: str | None = Field(None, pattern=r"^https?://\S+$",
                                                           validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    """full URL spans are posted to, instead of `<OTEL_EXPORTER_OTLP_ENDPOINT>/v1/traces`"""
    otel_exporter_otlp_protocol: str | None = Field(None, validation_alias="OTEL_EXPORTER_OTLP_PROTOCOL",
                                                    json_schema_extra={"unset": "`http/protobuf`"})
    """only `http/protobuf` is installed; another value stops a traced process at start"""
    otel_service_name: str = Field("commitline", min_length=1, max_length=200, validation_alias="OTEL_SERVICE_NAME")
    """the `service.name` of commitline's spans"""
    otel_sdk_disabled: bool = Field(False, validation_alias="OTEL_SDK_DISABLED")
    """`true`: no tracing whatever the other `OTEL_*` variables say"""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Direct construction is exact: a stray variable in the caller's environment never
        # changes a test's or a bench's settings. ``load_settings`` is the one reader of the environment.
        return (init_settings,)

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _parsable_url(cls, url: SecretStr | None) -> SecretStr | None:
        if url is not None:
            try:
                parts = conninfo_to_dict(url.get_secret_value())
            except Exception as e:
                raise ValueError(f"is not a valid PostgreSQL connection URL{_url_problem(str(e))}") from None
            for name, allowed in _LIBPQ_CHOICES.items():  # else a typo surfaces as an unreachable store
                if name in parts and parts[name] not in allowed:
                    raise ValueError(f"has {name}={parts[name]}, which libpq does not know: use one of "
                                     f"{', '.join(allowed)}")
            for port in str(parts.get("port") or "").split(","):  # one per host of a multi-host URL
                if port and not (port.isdigit() and 0 < int(port) < 65536):
                    raise ValueError(f"has port {port}, which is no TCP port (1-65535)")
            if "connect_timeout" in parts and not str(parts["connect_timeout"]).isdigit():
                raise ValueError(f"has connect_timeout={parts['connect_timeout']}: a whole number of seconds")
        return url

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _broker_addresses(cls, servers: str | None) -> str | None:
        if servers is not None:
            for address in servers.split(","):
                host, _, port = address.rpartition(":")
                if "://" in host:
                    raise ValueError(f"has {address!r}: give host:port without a scheme ({host.split('://')[0]}://)")
                if not _BROKER_HOST.fullmatch(host):
                    raise ValueError(f"has {address!r}, whose host is no host name, IPv4 or [IPv6] address")
                if not (port.isdigit() and 0 < int(port) < 65536):
                    raise ValueError(f"has {address!r}, whose port is no TCP port (1-65535)")
        return servers

    @field_validator("schema_name")
    @classmethod
    def _not_postgresqls_own(cls, schema: str | None) -> str | None:
        if schema is not None and (problem := schema_name_problem(schema)) is not None:
            raise ValueError(f"{problem}: choose another name")
        return schema

    @field_validator("master_key", "previous_master_key")
    @classmethod
    def _master_key_bytes(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None:
            from commitline.infrastructure.personal.master import MasterKey

            MasterKey.parse(key.get_secret_value())  # ValueError naming no part of the value
        return key

    @model_validator(mode="after")
    def _consistent_kafka_security(self) -> Settings:
        # Raised as it is (pydantic passes on anything but ValueError): each message names its variable.
        protocol = self.kafka_security_protocol
        if protocol.startswith("SASL"):
            for name in ("kafka_username", "kafka_password"):
                if getattr(self, name) is None:
                    raise ConfigurationError(_VARIABLE_OF[name], f"is required with COMMITLINE_KAFKA_SECURITY_PROTOCOL"
                                             f"={protocol} (SASL {self.kafka_sasl_mechanism} needs a user and a "
                                             "password)")
        else:  # credentials given for a protocol that sends none: the operator meant SASL, and would not be told
            for name in ("kafka_username", "kafka_password"):
                if getattr(self, name) is not None:
                    raise ConfigurationError(_VARIABLE_OF[name], f"is set but COMMITLINE_KAFKA_SECURITY_PROTOCOL is "
                                             f"{protocol}, which sends no credentials: choose SASL_SSL or "
                                             "SASL_PLAINTEXT")
        if not protocol.endswith("SSL"):
            for name in ("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile", "kafka_ssl_key_password"):
                if getattr(self, name) is not None:
                    raise ConfigurationError(_VARIABLE_OF[name], f"is set but COMMITLINE_KAFKA_SECURITY_PROTOCOL is "
                                             f"{protocol}, which does not use TLS: choose SSL or SASL_SSL")
        if self.gateway == "http" and self.gateway_url is None:
            raise ConfigurationError("COMMITLINE_GATEWAY_URL", "is required with COMMITLINE_GATEWAY=http: the base "
                                     "URL of the payment gateway")
        if self.kafka_ssl_keyfile is not None and self.kafka_ssl_certfile is None:
            raise ConfigurationError("COMMITLINE_KAFKA_SSL_KEYFILE", "needs COMMITLINE_KAFKA_SSL_CERTFILE, the "
                                     "client certificate it belongs to")
        if self.kafka_ssl_key_password is not None and self.kafka_ssl_certfile is None:
            raise ConfigurationError("COMMITLINE_KAFKA_SSL_KEY_PASSWORD", "needs COMMITLINE_KAFKA_SSL_CERTFILE, the "
                                     "client certificate whose key it unlocks")
        return self

    def for_domain(self, schema: str) -> Settings:
        """These settings with the schema and topic prefix of a domain whose store is ``schema`` when they are not
        set: the schema itself, and ``<schema>.`` (so a configured schema keeps the domain's topic names)."""
        resolved = self.schema_name or schema
        prefix = self.kafka_topic_prefix if self.kafka_topic_prefix is not None else f"{schema}."
        if (resolved, prefix) == (self.schema_name, self.kafka_topic_prefix):
            return self
        return self.model_copy(update={"schema_name": resolved, "kafka_topic_prefix": prefix})

    def command_limits(self) -> CommandLimits:
        return CommandLimits(self.max_command_bytes, self.max_string_length, self.max_list_length,
                             self.max_nesting_depth)

    def connection_parts(self) -> dict[str, Any]:
        """Every libpq parameter of the configured database URL (sslmode, sslrootcert, application_name,
        options, connect_timeout, ...), with host, port, dbname, user and password always present (secrets
        included: pass it to connections, never print it). Each connection commitline opens uses all of it."""
        assert self.database_url is not None
        parts: dict[str, Any] = conninfo_to_dict(self.database_url.get_secret_value())
        port = str(parts.get("port", 5432))
        return {
            **TCP_LIVENESS,
            **parts,
            "host": parts.get("host", "127.0.0.1"),
            "port": int(port) if port.isdigit() else port,  # "5432,5433" when several hosts are listed
            "dbname": parts.get("dbname", "postgres"),
            "user": parts.get("user", "postgres"),
            "password": parts.get("password", ""),
        }


_VARIABLE_OF: dict[str, str] = {name: str(f.validation_alias) for name, f in Settings.model_fields.items()}
_SECRETS = {_VARIABLE_OF[name] for name, f in Settings.model_fields.items() if SecretStr in get_args(f.annotation)}


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ`` (through
    the hook its dotenv source overrides too), reading only the declared variables: by-name
    construction would otherwise also admit a variable named ``pool_size``."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ
        super().__init__(Settings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        declared = {k: v for k, v in self.environ.items() if k in _VARIABLE_OF.values()}
        return parse_env_vars(declared, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


#: Prefixes of the variables of the test suite's and the benchmarks' own helpers (not settings of a process).
_TOOLING_PREFIXES = ("COMMITLINE_FUZZ_", "COMMITLINE_BENCH_", "COMMITLINE_TEST_")
_warned: set[str] = set()


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``COMMITLINE_*`` variable of ``environ`` that is no setting (a misspelt one is
    otherwise silently unused: ``COMMITLINE_DATABSE_URL`` would leave the embedded PostgreSQL in use), naming the
    setting it is closest to."""
    known = set(_VARIABLE_OF.values())
    warnings = []
    for name in sorted(environ):
        if name.startswith("COMMITLINE_") and name not in known and not name.startswith(_TOOLING_PREFIXES):
            close = difflib.get_close_matches(name[len("COMMITLINE_"):], [k[len("COMMITLINE_"):] for k in known
                                                                          if k.startswith("COMMITLINE_")], 1, 0.8)
            warnings.append(f"{name} is not a commitline setting, so it is not used"
                            + (f": did you mean COMMITLINE_{close[0]}?" if close else
                               " (docs/reference/configuration.md lists them)"))
    return warnings


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``environ`` (default ``os.environ``); an empty value counts as unset. A ``COMMITLINE_*``
    variable that is no setting is warned about (once per process)."""
    for warning in unknown_variables(os.environ if environ is None else environ):
        if warning not in _warned:
            _warned.add(warning)
            logging.getLogger(__name__).warning("%s", warning)
    values = _Environment(os.environ if environ is None else environ)()
    try:
        return Settings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        variable = str(first["loc"][0]) if first["loc"] else ""  # values are keyed by variable name
        shown = ""
        if variable in values and variable not in _SECRETS:
            shown = f" (got {_USERINFO.sub('://<credentials>@', repr(values[variable]))})"
        message = first["msg"].removeprefix("Value error, ")  # pydantic's words for a validator's own ValueError
        raise ConfigurationError(variable, f"{message}{shown}") from None


#: The user and password of a URL (``scheme://user:password@host``): never shown back, whatever the variable.
_USERINFO = re.compile(r"://[^/@\s]*@")


def hide_secrets(text: str, settings: Settings, also: Iterable[str] = ()) -> str:
    """``text`` (a message of code outside commitline's control: a domain's port factory, say) with every secret
    setting's value, the database password among them, ``also``'s and any URL's user and password replaced."""
    secrets = {f.get_secret_value() for name in Settings.model_fields
               if isinstance(f := getattr(settings, name), SecretStr)} | set(also)
    if settings.database_url is not None:
        secrets.add(str(conninfo_to_dict(settings.database_url.get_secret_value()).get("password") or ""))
    for secret in sorted(filter(None, secrets), key=len, reverse=True):  # a secret inside another: the longer first
        text = text.replace(secret, "<secret>")
    return _USERINFO.sub("://<credentials>@", text)


def variables_markdown() -> str:
    """The configuration table of the documentation's reference, generated from ``Settings``."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in Settings.model_fields.values():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if f.default is None:
            default = f"unset: {extra['unset']}" if "unset" in extra else "unset"
        else:
            default = f"`{str(f.default).lower() if isinstance(f.default, bool) else f.default}`"
        rows.append(f"| `{f.validation_alias}` | {default} | {f.description} |")
    rows += [f"| `{name}` | {default} | {meaning} |" for name, default, meaning in TOOLING_VARIABLES]
    return "\n".join(rows)


if __name__ == "__main__":
    print(variables_markdown())
