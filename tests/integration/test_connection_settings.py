"""Connection settings on real servers: every libpq parameter of the database URL reaches every
connection commitline opens, TLS is never silently dropped, Kafka TLS files are loaded or refused,
and ``publish`` never publishes a real database's events into a throwaway broker."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from commitline.application.errors import ConfigurationError, StoreUnavailable
from commitline.composition import bootstrap
from commitline.infrastructure.config import Settings, load_settings
from commitline.infrastructure.followers.lease import Lease
from commitline.infrastructure.followers.wakeup import LogWakeup
from commitline.infrastructure.kafka.producer import client_options
from tests.support import settings_for

PASSWORD, SSL_PASSWORD = "hunter2-db-secret", "ssl-key-secret-77"


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def schema_exists(pg_dsn: str, schema: str) -> bool:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (schema,)).fetchone()[0]


# -- PostgreSQL: TLS -----------------------------------------------------------------------


def require_ssl_url(pg_dsn: str) -> str:
    """The test server, which has no SSL, asked for with sslmode=require (and secrets to keep hidden)."""
    return make_conninfo(pg_dsn, sslmode="require", password=PASSWORD, sslpassword=SSL_PASSWORD)


def test_sslmode_require_is_honoured_bootstrap_fails_with_store_unavailable(pg_dsn: str, schema: str) -> None:
    with pytest.raises(StoreUnavailable) as caught:
        bootstrap(settings_for(require_ssl_url(pg_dsn), schema))
    shown = f"{caught.value} {caught.value.to_dict()}"
    assert "SSL" in shown and "sslmode=require" in shown
    assert PASSWORD not in shown and SSL_PASSWORD not in shown
    assert not schema_exists(pg_dsn, schema)  # no plaintext fallback: nothing was migrated


def test_sslmode_require_is_honoured_by_the_cli_exit_3(pg_dsn: str, schema: str) -> None:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": require_ssl_url(pg_dsn), "COMMITLINE_SCHEMA": schema}
    for args in (["status"], ["migrate", "--check"]):
        out = cli(args, env)
        assert out.returncode == 3, out.stderr[-2000:]
        assert "store_unavailable" in out.stderr and "SSL" in out.stderr
        assert PASSWORD not in out.stderr + out.stdout and SSL_PASSWORD not in out.stderr + out.stdout
    assert not schema_exists(pg_dsn, schema)


# -- PostgreSQL: other parameters ----------------------------------------------------------


def backend(pg_dsn: str, pid: int) -> tuple[str, str]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute("SELECT application_name, query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()


def test_every_libpq_parameter_reaches_the_pool_the_lease_and_the_wakeup(pg_dsn: str, schema: str) -> None:
    name = f"cl-{schema}"
    # connect_timeout too: commitline's own default for it must give way, not clash.
    url = make_conninfo(pg_dsn, application_name=name, options="-c statement_timeout=4321", connect_timeout="7")
    with bootstrap(settings_for(url, schema)) as app:
        with app.datastore.get_connection() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "4321ms"
            assert backend(pg_dsn, conn.info.backend_pid)[0] == name
        with psycopg.connect(pg_dsn) as conn:
            pooled = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                  (name,)).fetchone()[0]
        assert pooled >= app.settings.pool_size

        lease = Lease(app.conninfo, schema, "probe-follower")
        assert lease.try_acquire()
        try:
            pid, timeout = lease.run(lambda c: (c.info.backend_pid, c.execute("SHOW statement_timeout").fetchone()[0]))
            assert backend(pg_dsn, pid)[0] == name and timeout == "4321ms"
        finally:
            lease.release()

        async def listening_backend() -> tuple[str, str]:
            wakeup = LogWakeup(app.conninfo, app.recorder.channel_name)
            try:
                assert await wakeup.wait(0.05) is False
                with psycopg.connect(pg_dsn) as conn:
                    return conn.execute("SELECT application_name, query FROM pg_stat_activity "
                                        "WHERE query LIKE 'LISTEN %%' AND application_name = %s", (name,)).fetchone()
            finally:
                await wakeup.close()

        application, query = asyncio.run(listening_backend())
        assert application == name and app.recorder.channel_name in query


def test_a_follower_lease_without_application_name_in_the_url_is_named_after_the_follower(app, pg_dsn: str,
                                                                                         schema: str) -> None:
    lease = Lease(app.conninfo, schema, "probe-follower")
    assert lease.try_acquire()
    try:
        assert backend(pg_dsn, lease.run(lambda c: c.info.backend_pid))[0] == "commitline probe-follower"
    finally:
        lease.release()


# -- publish: never into a throwaway broker ------------------------------------------------


def test_publish_with_a_configured_database_and_no_kafka_refuses_and_saves_nothing(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        for n in range(3):
            app.dispatch({"type": "create_payment", "amount": "1.00", "currency": "EUR", "account": "a"},
                         idempotency_key=f"k{n}")
        with pytest.raises(ConfigurationError) as caught:
            app.publisher()
        assert caught.value.variable == "KAFKA_BOOTSTRAP_SERVERS"
        assert app.embedded_kafka is None
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update({"COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema})
    out = cli(["publish", "--drain"], env)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "KAFKA_BOOTSTRAP_SERVERS" in out.stderr and "configuration_error" in out.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.follower_positions",)).fetchone()[0]
        published = conn.execute(f'SELECT count(*) FROM "{schema}".follower_positions '
                                 "WHERE name = 'kafka-publisher' AND position > 0").fetchone()[0]
    assert published == 0
    elsewhere = cli(["publish", "--drain"], {**env, "COMMITLINE_SCHEMA": f"{schema}_new"})
    assert elsewhere.returncode == 3 and "KAFKA_BOOTSTRAP_SERVERS" in elsewhere.stderr
    with psycopg.connect(pg_dsn) as conn:  # refused before the store is opened: no schema made for it
        assert conn.execute("SELECT to_regnamespace(%s)", (f"{schema}_new",)).fetchone() == (None,)


def test_the_embedded_demo_setup_may_publish_to_an_embedded_broker(tmp_path: Path, schema: str) -> None:
    with bootstrap(Settings(data_dir=tmp_path / "data", schema_name=schema)) as app:
        publisher = app.publisher()  # no ConfigurationError: the database is throwaway too
        assert publisher.settings.kafka_bootstrap_servers is not None
        assert publisher.settings.kafka_idempotence is False  # the embedded broker cannot do it


# -- Kafka TLS files -----------------------------------------------------------------------


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, and a client certificate it signed with a password-protected key, made by the openssl tool."""
    d = tmp_path_factory.mktemp("tls")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
            "-days", "2", "-subj", "/CN=commitline test CA")
    openssl("req", "-newkey", "rsa:2048", "-keyout", str(d / "client.key"), "-passout", "pass:k3y-pass",
            "-out", str(d / "client.csr"), "-subj", "/CN=commitline client")
    openssl("x509", "-req", "-in", str(d / "client.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-out", str(d / "client.pem"), "-days", "2")
    (d / "not-a-cert.pem").write_text("this is not a certificate\n")
    return {"ca": d / "ca.pem", "cert": d / "client.pem", "key": d / "client.key", "junk": d / "not-a-cert.pem"}


def tls_settings(**environ: str) -> Settings:
    return load_settings({"KAFKA_BOOTSTRAP_SERVERS": "kafka:9093", "COMMITLINE_KAFKA_SECURITY_PROTOCOL": "SSL",
                          **environ})


def test_kafka_tls_files_are_loaded_into_the_ssl_context(tls_files: dict[str, Path]) -> None:
    context = client_options(tls_settings(
        COMMITLINE_KAFKA_SSL_CAFILE=str(tls_files["ca"]), COMMITLINE_KAFKA_SSL_CERTFILE=str(tls_files["cert"]),
        COMMITLINE_KAFKA_SSL_KEYFILE=str(tls_files["key"]), COMMITLINE_KAFKA_SSL_KEY_PASSWORD="k3y-pass",
    ))["ssl_context"]
    subjects = [dict(pair[0] for pair in cert["subject"]) for cert in context.get_ca_certs()]
    assert {"commonName": "commitline test CA"} in subjects


def test_kafka_tls_files_that_cannot_be_loaded_are_refused_naming_the_variable(tls_files: dict[str, Path]) -> None:
    with pytest.raises(ConfigurationError) as bad_ca:
        client_options(tls_settings(COMMITLINE_KAFKA_SSL_CAFILE=str(tls_files["junk"])))
    assert bad_ca.value.variable == "COMMITLINE_KAFKA_SSL_CAFILE"
    with pytest.raises(ConfigurationError) as wrong_password:
        client_options(tls_settings(
            COMMITLINE_KAFKA_SSL_CERTFILE=str(tls_files["cert"]), COMMITLINE_KAFKA_SSL_KEYFILE=str(tls_files["key"]),
            COMMITLINE_KAFKA_SSL_KEY_PASSWORD="wrong-pass-99",
        ))
    assert wrong_password.value.variable == "COMMITLINE_KAFKA_SSL_KEYFILE"
    assert "wrong-pass-99" not in str(wrong_password.value)
    with pytest.raises(ConfigurationError) as no_password:  # an encrypted key without one: refused, never a prompt
        client_options(tls_settings(COMMITLINE_KAFKA_SSL_CERTFILE=str(tls_files["cert"]),
                                    COMMITLINE_KAFKA_SSL_KEYFILE=str(tls_files["key"])))
    assert no_password.value.variable == "COMMITLINE_KAFKA_SSL_KEYFILE"


def test_a_drain_with_nothing_to_publish_says_that_the_broker_cannot_be_reached(pg_dsn: str, schema: str) -> None:
    """Everything stored is published (there is nothing), so the drain ends with 0; but a wrong or dead broker
    address is said at start, not left for the first event to find."""
    with socket.socket() as probe:  # a port nothing listens on once the block ends
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema,
           "KAFKA_BOOTSTRAP_SERVERS": address}
    out = cli(["publish", "--drain"], env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"the broker at {address} cannot be reached yet" in out.stderr, out.stderr[-2000:]
