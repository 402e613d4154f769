"""Reading Kafka records with personal fields: a payment's ``account`` is published sealed (the record's bytes hold
no plain value), an independent consumer (confluent-kafka, a client commitline does not use) reads the record
from the real broker, ``commitline.PersonalRecords`` opens it with the store's data keys and master key, and
once the subject is erased (by another process, ``commitline erase``) it opens as ``ERASED``. Records without
personal fields come back unchanged; a missing or wrong master key and a value that is no envelope are typed
errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import orjson
import pytest
from jsonschema_rs import Draft202012Validator

from commitline import ERASED, ConfigurationError, InvalidValue, PersonalRecords, WrongMasterKey
from commitline.composition import bootstrap
from commitline.infrastructure.kafka.envelope import ENVELOPE_SCHEMA
from commitline.infrastructure.personal.master import generate
from tests.kafka_reader import read_topics
from tests.support import MASTER_KEY, FollowerThread, kafka_settings, wait_for

pytestmark = pytest.mark.integration
ACCOUNT = "GB33BUKB20201555555555"


@pytest.fixture
def published(pg_dsn: str, schema: str, kafka_bootstrap: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """A created and submitted payment of tenant ``default``, published: its id and its records by event type."""
    settings = kafka_settings(pg_dsn, schema, kafka_bootstrap)
    with bootstrap(settings) as app, FollowerThread(app.publisher) as background:
        payment = app.dispatch({"type": "create_payment", "amount": "12.50", "currency": "EUR", "account": ACCOUNT},
                               idempotency_key="create").aggregate_id
        app.dispatch({"type": "submit_payment", "payment_id": str(payment)}, idempotency_key="submit")
        background.wait_until_at(app.recorder.max_notification_id())
    values = [r.value for r in read_topics(kafka_bootstrap, [f"{settings.kafka_topic_prefix}PaymentTransaction"])]
    assert len(values) == 2, values
    yield str(payment), {orjson.loads(v)["type"]: v for v in values}


def erase(pg_dsn: str, schema: str, subject: str) -> None:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    done = subprocess.run([sys.executable, "-m", "commitline.cli", "erase", "--tenant", "default", "--subject",
                           subject], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_consumer_opens_the_personal_fields_until_the_subject_is_erased(
        published: tuple[str, dict[str, bytes]], pg_dsn: str, schema: str) -> None:
    payment, records = published
    created, submitted = records["PaymentCreated"], records["PaymentSubmitted"]
    assert ACCOUNT.encode() not in created  # the raw record holds no plain value
    raw = orjson.loads(created)
    assert not list(Draft202012Validator(ENVELOPE_SCHEMA, validate_formats=True).iter_errors(raw))
    assert raw["personal"] == ["account"] and set(raw["payload"]["account"]) == {"ciphertext", "key_id"}
    assert "personal" not in orjson.loads(submitted)

    # Data keys held for an hour: only the erasure's notification can make the reader forget one before the end.
    with PersonalRecords(pg_dsn, schema=schema, ttl_s=3600) as reader:
        opened = reader.open(created)
        assert opened["payload"] == {**raw["payload"], "account": ACCOUNT}
        assert {k: v for k, v in opened.items() if k != "payload"} == {k: v for k, v in raw.items() if k != "payload"}
        assert reader.open(submitted) == orjson.loads(submitted)  # no personal field: unchanged
        assert reader.open(raw)["payload"]["account"] == ACCOUNT  # the parsed value is taken too
        assert ACCOUNT not in repr(reader) and pg_dsn not in repr(reader)

        erase(pg_dsn, schema, payment)  # by another process: its notification reaches this reader
        wait_for(lambda: reader.open(created)["payload"]["account"] is ERASED, "the erasure to reach the reader")
        assert reader.open(submitted) == orjson.loads(submitted)
    with PersonalRecords(pg_dsn, schema=schema) as fresh:
        assert fresh.open(created)["payload"]["account"] is ERASED


def test_a_missing_or_wrong_master_key_and_a_value_that_is_no_envelope_are_typed_errors(
        published: tuple[str, dict[str, bytes]], pg_dsn: str, schema: str) -> None:
    _, records = published
    created = records["PaymentCreated"]
    with PersonalRecords(pg_dsn, schema=schema, master_key="") as unkeyed:
        with pytest.raises(ConfigurationError) as missing:
            unkeyed.open(created)
        assert "COMMITLINE_MASTER_KEY" in str(missing.value)
        assert unkeyed.open(records["PaymentSubmitted"])["type"] == "PaymentSubmitted"  # needs no key
    wrong_key = generate()
    with PersonalRecords(pg_dsn, schema=schema, master_key=wrong_key) as wrong:
        with pytest.raises(WrongMasterKey) as refused:
            wrong.open(created)
        assert wrong_key not in str(refused.value) and MASTER_KEY not in str(refused.value)
    with PersonalRecords(pg_dsn, schema=schema) as reader:
        for value in (b"not json", b"[1, 2]", 42, b"{}", b'{"a": 1}', {"event_id": "e", "tenant": "t"}):
            with pytest.raises(InvalidValue):
                reader.open(value)  # type: ignore[arg-type]
        with pytest.raises(InvalidValue):
            reader.open({"personal": ["account"], "payload": {}})

