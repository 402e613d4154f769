"""Kafka security settings: what is refused at start, and the aiokafka options the rest produce."""

from __future__ import annotations

import ssl

import pytest

from commitline.application.errors import ConfigurationError
from commitline.infrastructure.config import load_settings
from commitline.infrastructure.kafka.producer import client_options

BROKERS = {"KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9093,kafka-2:9093"}
AN_EXISTING_FILE = __file__  # validation only checks that the path is a file; nothing here reads it


def refused(environ: dict[str, str]) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        load_settings({**BROKERS, **environ})
    return caught.value


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_without_a_user_or_a_password_is_refused_naming_the_variable(protocol: str) -> None:
    protocol_env = {"COMMITLINE_KAFKA_SECURITY_PROTOCOL": protocol}
    no_user = refused({**protocol_env, "COMMITLINE_KAFKA_PASSWORD": "pa55word"})
    assert no_user.variable == "COMMITLINE_KAFKA_USERNAME" and protocol in str(no_user)
    assert "pa55word" not in str(no_user) and "pa55word" not in str(no_user.to_dict())
    no_password = refused({**protocol_env, "COMMITLINE_KAFKA_USERNAME": "svc"})
    assert no_password.variable == "COMMITLINE_KAFKA_PASSWORD" and protocol in str(no_password)
    assert refused(protocol_env).variable == "COMMITLINE_KAFKA_USERNAME"


@pytest.mark.parametrize("variable", ["COMMITLINE_KAFKA_SSL_CAFILE", "COMMITLINE_KAFKA_SSL_CERTFILE",
                                      "COMMITLINE_KAFKA_SSL_KEY_PASSWORD"])
@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"])
def test_tls_files_without_a_tls_protocol_are_refused_rather_than_silently_unused(variable: str,
                                                                                 protocol: str) -> None:
    credentials = {"COMMITLINE_KAFKA_USERNAME": "svc", "COMMITLINE_KAFKA_PASSWORD": "pa55word"}
    environ = {"COMMITLINE_KAFKA_SECURITY_PROTOCOL": protocol, **(credentials if protocol.startswith("SASL") else {}),
               variable: AN_EXISTING_FILE}
    error = refused(environ)
    assert error.variable == variable and protocol in str(error) and "SSL" in str(error)
    assert "pa55word" not in str(error)


@pytest.mark.parametrize("variable", ["COMMITLINE_KAFKA_USERNAME", "COMMITLINE_KAFKA_PASSWORD"])
@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
def test_sasl_credentials_without_a_sasl_protocol_are_refused_rather_than_silently_unused(variable: str,
                                                                                         protocol: str) -> None:
    error = refused({"COMMITLINE_KAFKA_SECURITY_PROTOCOL": protocol, variable: "pa55word"})
    assert error.variable == variable and protocol in str(error) and "SASL_SSL" in str(error)
    assert "pa55word" not in str(error) and "pa55word" not in str(error.to_dict())


def test_inconsistent_or_missing_tls_files_are_refused_naming_the_variable() -> None:
    tls = {"COMMITLINE_KAFKA_SECURITY_PROTOCOL": "SSL"}
    key_alone = refused({**tls, "COMMITLINE_KAFKA_SSL_KEYFILE": AN_EXISTING_FILE})
    assert key_alone.variable == "COMMITLINE_KAFKA_SSL_KEYFILE" and "COMMITLINE_KAFKA_SSL_CERTFILE" in str(key_alone)
    password_alone = refused({**tls, "COMMITLINE_KAFKA_SSL_KEY_PASSWORD": "k3ypass"})
    assert password_alone.variable == "COMMITLINE_KAFKA_SSL_KEY_PASSWORD" and "k3ypass" not in str(password_alone)
    missing = refused({**tls, "COMMITLINE_KAFKA_SSL_CAFILE": "/no/such/ca.pem"})
    assert missing.variable == "COMMITLINE_KAFKA_SSL_CAFILE" and "/no/such/ca.pem" in str(missing)


def test_plaintext_options_have_neither_tls_nor_sasl() -> None:
    options = client_options(load_settings(BROKERS))
    assert options == {"bootstrap_servers": "kafka-1:9093,kafka-2:9093", "security_protocol": "PLAINTEXT"}


def test_sasl_plaintext_options_carry_the_credentials_and_no_tls() -> None:
    settings = load_settings({**BROKERS, "COMMITLINE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                              "COMMITLINE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                              "COMMITLINE_KAFKA_USERNAME": "svc", "COMMITLINE_KAFKA_PASSWORD": "pa55word"})
    options = client_options(settings)
    assert "ssl_context" not in options
    assert (options["security_protocol"], options["sasl_mechanism"], options["sasl_plain_username"],
            options["sasl_plain_password"]) == ("SASL_PLAINTEXT", "SCRAM-SHA-512", "svc", "pa55word")
    assert "pa55word" not in repr(settings)


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_tls_protocols_get_a_verifying_ssl_context(protocol: str) -> None:
    credentials = {"COMMITLINE_KAFKA_USERNAME": "svc", "COMMITLINE_KAFKA_PASSWORD": "pa55word"}
    settings = load_settings({**BROKERS, "COMMITLINE_KAFKA_SECURITY_PROTOCOL": protocol,
                              **(credentials if protocol.startswith("SASL") else {})})
    options = client_options(settings)
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert ("sasl_plain_username" in options) == protocol.startswith("SASL")
