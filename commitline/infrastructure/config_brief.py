"""The README's configuration table: every variable, its default and a few words on it (``python -m
commitline.infrastructure.config_brief`` prints it). The configuration reference (``config.variables_markdown``)
holds each one's whole meaning, and what an unset one does; a test keeps the README's copy equal to this table,
and this table equal to ``Settings``.
"""

from __future__ import annotations

from commitline.infrastructure.config import TOOLING_VARIABLES, Settings

#: Each variable in a few words, in the order of ``Settings``.
BRIEFS: dict[str, str] = {
    "COMMITLINE_DATABASE_URL": "PostgreSQL URL (secret)",
    "COMMITLINE_MASTER_KEY": "wraps personal data keys (secret)",
    "COMMITLINE_PREVIOUS_MASTER_KEY": "the one before, while rotating",
    "COMMITLINE_DATA_KEY_TTL_S": "data key reuse limit",
    "COMMITLINE_DATA_DIR": "local services' data",
    "COMMITLINE_APP": "your domain, as `module:attribute`",
    "COMMITLINE_SCHEMA": "schema of commitline's tables",
    "COMMITLINE_POOL_SIZE": "connections kept open",
    "COMMITLINE_POOL_MAX_OVERFLOW": "extra connections under load",
    "COMMITLINE_POOL_TIMEOUT_S": "longest wait for a connection (and, at least 5 s, for the pool to open its kept "
                                 "connections at start)",
    "COMMITLINE_SNAPSHOT_INTERVAL": "snapshot every N events (0: none)",
    "COMMITLINE_AGGREGATE_CACHE_SIZE": "aggregates kept decoded (0: none)",
    "COMMITLINE_GROUP_COMMIT_MAX": "commands per shared transaction",
    "COMMITLINE_RETRY_MAX_ATTEMPTS": "runs of a command on a moving stream",
    "COMMITLINE_RETRY_BASE_DELAY_MS": "first back-off cap",
    "COMMITLINE_RETRY_MAX_DELAY_MS": "largest back-off",
    "COMMITLINE_LOG_LEVEL": "`DEBUG` to `ERROR`",
    "KAFKA_BOOTSTRAP_SERVERS": "Kafka brokers, `host:port,...`",
    "COMMITLINE_KAFKA_TOPIC_PREFIX": "topic = prefix + aggregate type",
    "COMMITLINE_KAFKA_PARTITIONS": "partitions of created topics",
    "COMMITLINE_KAFKA_REPLICATION_FACTOR": "replication of created topics",
    "COMMITLINE_KAFKA_IDEMPOTENCE": "idempotent producer",
    "COMMITLINE_KAFKA_SECURITY_PROTOCOL": "`PLAINTEXT`, `SSL`, `SASL_*`",
    "COMMITLINE_KAFKA_SASL_MECHANISM": "`PLAIN` or `SCRAM-SHA-*`",
    "COMMITLINE_KAFKA_USERNAME": "SASL user name",
    "COMMITLINE_KAFKA_PASSWORD": "SASL password (secret)",
    "COMMITLINE_KAFKA_SSL_CAFILE": "brokers' CA certificates (PEM)",
    "COMMITLINE_KAFKA_SSL_CERTFILE": "client certificate (PEM)",
    "COMMITLINE_KAFKA_SSL_KEYFILE": "client key (PEM)",
    "COMMITLINE_KAFKA_SSL_KEY_PASSWORD": "client key's password (secret)",
    "COMMITLINE_PUBLISH_BATCH_SIZE": "events per publish batch",
    "COMMITLINE_PUBLISH_POLL_INTERVAL_MS": "longest wait with no wake-up",
    "COMMITLINE_PUBLISH_MAX_BACKOFF_MS": "longest pause on broker errors",
    "COMMITLINE_PUBLISH_BUCKETS": "buckets `publish` instances share",
    "COMMITLINE_PROJECT_BATCH_SIZE": "events per projection transaction",
    "COMMITLINE_METRICS_INTERVAL_S": "how often `publish` logs metrics",
    "COMMITLINE_STATUS_MAX_LAG_EVENTS": "`status --check` lag limit, events",
    "COMMITLINE_STATUS_MAX_LAG_S": "`status --check` lag limit, seconds",
    "COMMITLINE_MAX_EVENT_BYTES": "largest stored event",
    "COMMITLINE_KAFKA_MAX_MESSAGE_BYTES": "the broker's `message.max.bytes`",
    "COMMITLINE_MAX_COMMAND_BYTES": "largest command (JSON bytes)",
    "COMMITLINE_MAX_STRING_LENGTH": "longest string in a command",
    "COMMITLINE_MAX_LIST_LENGTH": "longest list in a command",
    "COMMITLINE_MAX_NESTING_DEPTH": "deepest nesting in a command",
    "COMMITLINE_GATEWAY": "a process manager's port adapter",
    "COMMITLINE_GATEWAY_URL": "HTTP gateway's base URL",
    "COMMITLINE_GATEWAY_TOKEN": "HTTP gateway's token (secret)",
    "COMMITLINE_GATEWAY_TIMEOUT_S": "longest gateway call, whole answer",
    "COMMITLINE_GATEWAY_ATTEMPTS": "attempts of a gateway call",
    "COMMITLINE_GATEWAY_BACKOFF_MS": "pause after a failed gateway call",
    "COMMITLINE_DISPATCH_CPU": "CPU of dispatching threads",
    "COMMITLINE_HTTP_HOST": "address `serve` listens on",
    "COMMITLINE_HTTP_PORT": "port `serve` listens on",
    "COMMITLINE_HTTP_WORKERS": "worker processes of `serve`",
    "COMMITLINE_HTTP_OPERATOR_PORT": "port of the status page and metrics",
    "COMMITLINE_HTTP_OPERATOR_HOST": "address of the operators' port",
    "COMMITLINE_HTTP_MAX_BODY_BYTES": "largest request body",
    "COMMITLINE_API_KEY_CACHE_S": "API key reuse limit",
    "OTEL_TRACES_EXPORTER": "`otlp`, `console` or `none`",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "OTLP collector (turns tracing on)",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "URL spans are posted to",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "only `http/protobuf`",
    "OTEL_SERVICE_NAME": "`service.name` of the spans",
    "OTEL_SDK_DISABLED": "`true`: no tracing at all",
    "COMMITLINE_TEST_DSN": "the test suite's PostgreSQL",
    "COMMITLINE_BENCH_DSN": "the benchmarks' PostgreSQL",
    "COMMITLINE_TEST_OUTAGE_S": "the outage test's length",
}


def variables() -> list[str]:
    """Every variable commitline and its tooling read, in the reference's order."""
    return [str(f.validation_alias) for f in Settings.model_fields.values()] + [n for n, _, _ in TOOLING_VARIABLES]


def brief_markdown() -> str:
    """The table: variable, default (``unset``: the reference says what that means) and the brief."""
    defaults = {str(f.validation_alias): "unset" if f.default is None else
                f"`{str(f.default).lower() if isinstance(f.default, bool) else f.default}`"
                for f in Settings.model_fields.values()}
    defaults.update({name: "unset" if d.startswith("unset") else d for name, d, _ in TOOLING_VARIABLES})
    rows = ["| variable | default | what |", "|---|---|---|"]
    rows += [f"| `{name}` | {defaults[name]} | {BRIEFS[name]} |" for name in variables()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(brief_markdown())
