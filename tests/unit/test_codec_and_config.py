"""Stored encoding round-trips exact types; configuration errors name the variable, never the secret."""

from __future__ import annotations

import re

import dataclasses
from datetime import datetime, timezone
from decimal import Decimal
from uuid import uuid4

import orjson
import pytest
from eventsourcing.persistence import Notification

from commitline.application.errors import ConfigurationError
from commitline.application.retry import RetryPolicy
from commitline.examples.payments import PaymentCreated
from commitline.examples import domain
from commitline.infrastructure.store.codec import EventCodec, RecordedEvent, encode_event
from commitline.infrastructure.store.log import notification
from commitline.infrastructure.config import Settings, load_settings, variables_markdown

CODEC = EventCodec(domain.check().registry)


def test_event_roundtrip_is_exact_and_stored_json_is_plain() -> None:
    event = PaymentCreated(
        event_id=uuid4(), aggregate_id=uuid4(), version=1,
        occurred_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc),
        amount=Decimal("0.10"), currency="EUR", account="acc",
    )
    stored = encode_event(event, "t1")
    assert orjson.loads(stored.state)["data"] == {"amount": "0.10", "currency": "EUR", "account": "acc"}
    back = CODEC.decode_event(stored.topic, stored.originator_id, stored.originator_version, stored.state)
    assert back.event == event and back.tenant == "t1" and back.aggregate_type == "PaymentTransaction"
    assert isinstance(back.event.amount, Decimal) and str(back.event.amount) == "0.10"
    assert back.event.occurred_at == event.occurred_at


def test_decoded_events_and_read_notifications_are_the_frozen_dataclasses_they_stand_for() -> None:
    """Both are built by filling the instance's dict (a frozen dataclass's ``__init__`` costs twice as much): the
    objects must be equal to, hash like and stay as immutable as the ones the constructors make."""
    event = PaymentCreated(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                           amount=Decimal("2.50"), currency="EUR", account="a")
    stored = encode_event(event, "t1")
    back = CODEC.decode_event(stored.topic, stored.originator_id, 1, stored.state)
    made = RecordedEvent(event=back.event, tenant="t1", aggregate_type="PaymentTransaction")
    assert back == made and hash(back) == hash(made) and repr(back) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.tenant = "t2"  # type: ignore[misc]

    read = notification(stored.originator_id, 1, stored.topic, stored.state, 7)
    constructed = Notification(stored.originator_id, 1, stored.topic, stored.state, 7)
    assert read == constructed and hash(read) == hash(constructed) and repr(read) == repr(constructed)
    assert (read.id, read.originator_version, read.topic) == (7, 1, "PaymentCreated")
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.id = 8  # type: ignore[misc]


def test_upcasting_old_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    event = PaymentCreated(event_id=uuid4(), aggregate_id=uuid4(), version=1,
                           occurred_at=datetime.now(timezone.utc), amount=Decimal("1"), currency="EUR", account="a")
    stored = encode_event(event, "t")  # written as version 1
    monkeypatch.setattr(PaymentCreated, "class_version", 2, raising=False)
    monkeypatch.setattr(PaymentCreated, "upcast_v1_v2",
                        staticmethod(lambda d: {**d, "account": d["account"].upper()}), raising=False)
    assert CODEC.decode_event(stored.topic, stored.originator_id, 1, stored.state).event.account == "A"


def test_configuration_defaults_and_errors() -> None:
    settings = load_settings({})
    assert settings.database_url is None and settings.snapshot_interval == 10
    with pytest.raises(ConfigurationError) as caught:
        load_settings({"COMMITLINE_POOL_SIZE": "lots"})
    assert caught.value.variable == "COMMITLINE_POOL_SIZE" and "lots" in str(caught.value)
    with pytest.raises(ConfigurationError) as bad_url:
        load_settings({"COMMITLINE_DATABASE_URL": "postgresql://u:hunter2@h:notaport/db x=y=z"})
    assert "hunter2" not in str(bad_url.value) and bad_url.value.variable == "COMMITLINE_DATABASE_URL"
    with pytest.raises(ConfigurationError, match="begins with pg_, which PostgreSQL keeps") as reserved:
        load_settings({"COMMITLINE_SCHEMA": "pg_catalog"})
    assert reserved.value.variable == "COMMITLINE_SCHEMA"
    assert not str(reserved.value).startswith("COMMITLINE_SCHEMA: Value error")  # pydantic's prefix is dropped
    for keyword in ("user", "order", "select", "int", "json_table"):
        with pytest.raises(ConfigurationError, match="is a PostgreSQL keyword, which cannot name a schema"):
            load_settings({"COMMITLINE_SCHEMA": keyword})
    with pytest.raises(ConfigurationError, match="is PostgreSQL's own schema"):
        load_settings({"COMMITLINE_SCHEMA": "information_schema"})
    with pytest.raises(ConfigurationError, match="has port 99999, which is no TCP port") as port:
        load_settings({"COMMITLINE_DATABASE_URL": "postgresql://u:hunter2@h:99999/db"})
    assert "hunter2" not in str(port.value)
    for url, said in [("postgresql://u@h:5432/db?password=hunter2&bogusopt=1", "the query parameter 'bogusopt'"),
                      ("postgresql://u:hun%ter2@h:5432/db", "a '%' in it is not followed by two hexadecimal digits"),
                      ("postgresql://u:hunter2@h/db?sslmode", "one of its query parameters has no '=value'"),
                      ("postgresql://u:hunter2@[::1:5432/db", "an IPv6 host address opened with '['"),
                      ("hunter2 host=h", "neither a postgresql:// URL nor space-separated key=value pairs")]:
        with pytest.raises(ConfigurationError, match=re.escape(said)) as bad:
            load_settings({"COMMITLINE_DATABASE_URL": url})
        assert "hunter2" not in str(bad.value) and "hun%ter2" not in str(bad.value)
    for servers, named in [("127.0.0.1:99999", "'127.0.0.1:99999', whose port is no TCP port"),
                           ("broker:9092,127.0.0.1:0", "'127.0.0.1:0', whose port is no TCP port"),
                           ("kafka://127.0.0.1:9092", "give host:port without a scheme (kafka://)"),
                           ("bro/ker:9092", "whose host is no host name")]:
        with pytest.raises(ConfigurationError, match=re.escape(named)) as broker:
            load_settings({"KAFKA_BOOTSTRAP_SERVERS": servers})
        assert "KAFKA_BOOTSTRAP_SERVERS" in str(broker.value)
    assert load_settings({"KAFKA_BOOTSTRAP_SERVERS": "kafka-1.internal:9092,10.0.0.2:19092,[::1]:9093"}
                         ).kafka_bootstrap_servers == "kafka-1.internal:9092,10.0.0.2:19092,[::1]:9093"
    with pytest.raises(ConfigurationError) as gateway:
        load_settings({"COMMITLINE_GATEWAY_URL": "ftp://user:GwSecretPw@gw.example/x"})
    assert "GwSecretPw" not in str(gateway.value) and "ftp://<credentials>@gw.example/x" in str(gateway.value)


def test_secret_never_in_repr() -> None:
    settings = load_settings({"COMMITLINE_DATABASE_URL": "postgresql://u:hunter2@h:5432/db"})
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.model_dump())
    assert settings.connection_parts()["password"] == "hunter2"


def test_direct_construction_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMITLINE_POOL_SIZE", "3")
    monkeypatch.setenv("pool_size", "4")
    assert Settings(schema_name="s1").pool_size == 10
    assert load_settings().pool_size == 3
    assert load_settings({"COMMITLINE_POOL_SIZE": "", "pool_size": "4"}).pool_size == 10  # empty = unset
    settings = load_settings({"COMMITLINE_KAFKA_IDEMPOTENCE": "false", "COMMITLINE_DATA_DIR": "/tmp/x"})
    assert settings.kafka_idempotence is False and str(settings.data_dir) == "/tmp/x"
    assert settings.model_copy(update={"pool_size": 7}).pool_size == 7
    with pytest.raises(ValueError):
        Settings(pool_size=0)
    with pytest.raises(ValueError):
        Settings(not_a_setting=1)


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "reference" / "configuration.md").read_text()
    assert "<!-- generated: configuration -->" in page, "the reference page must take its table from the code"
    table = variables_markdown()
    assert table.startswith("| variable | default | meaning |") and "`COMMITLINE_DATABASE_URL`" in table


def test_a_commitline_variable_that_is_no_setting_is_named_with_the_setting_it_is_closest_to() -> None:
    from commitline.infrastructure.config import unknown_variables

    warnings = unknown_variables({"COMMITLINE_DATABSE_URL": "postgresql://u:pw@db/x", "COMMITLINE_HTTP_PROT": "9",
                                  "COMMITLINE_WHATEVER": "1", "COMMITLINE_SCHEMA": "s", "COMMITLINE_FUZZ_SEED": "1",
                                  "COMMITLINE_TEST_DSN": "x", "KAFKA_BOOTSTRAP": "x"})
    assert warnings == [
        "COMMITLINE_DATABSE_URL is not a commitline setting, so it is not used: did you mean COMMITLINE_DATABASE_URL?",
        "COMMITLINE_HTTP_PROT is not a commitline setting, so it is not used: did you mean COMMITLINE_HTTP_PORT?",
        "COMMITLINE_WHATEVER is not a commitline setting, so it is not used (docs/reference/configuration.md lists "
        "them)",
    ]  # values never shown; the suite's and the benchmarks' own variables are not settings, and not warned about


def test_the_log_level_is_read_in_any_case() -> None:
    assert load_settings({"COMMITLINE_LOG_LEVEL": "debug"}).log_level == "DEBUG"
    with pytest.raises(ConfigurationError, match="COMMITLINE_LOG_LEVEL"):
        load_settings({"COMMITLINE_LOG_LEVEL": "loud"})


def test_every_variable_has_a_brief_for_the_readme_and_no_brief_names_another() -> None:
    from commitline.infrastructure.config_brief import BRIEFS, brief_markdown, variables

    assert list(BRIEFS) == variables(), "one brief per variable, in the settings' order"
    table = brief_markdown().splitlines()
    assert table[2] == "| `COMMITLINE_DATABASE_URL` | unset | PostgreSQL URL (secret) |"
    assert "| `COMMITLINE_POOL_SIZE` | `10` | connections kept open |" in table
    assert len(table) == 2 + len(variables())

def test_retry_policy_is_bounded_and_jittered() -> None:
    policy = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05)
    pauses = [[policy.pause(n) for n in range(1, 6)] for _ in range(200)]
    assert all(0 <= d <= min(0.05, 0.01 * 2**i) for row in pauses for i, d in enumerate(row))
    assert len({row[4] for row in pauses}) > 100  # full jitter: not one fixed delay
    assert max(row[4] for row in pauses) > 0.04  # the later pauses reach towards the cap
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_a_replay_decodes_each_stored_state_as_decode_event_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``decode_state`` (the command path's replay: the state parsed once, the payload filled in place) gives the
    event ``decode_event`` gives, for plain, Decimal and upcast payloads; an upcaster's own dict is never changed."""
    from commitline.examples.inventory import StockReceived
    from commitline.examples.orders import OrderPlaced

    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    events = [StockReceived(event_id=uuid4(), aggregate_id=uuid4(), version=3, occurred_at=at, quantity=7),
              OrderPlaced(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=at, item_id=uuid4(),
                          quantity=2, amount=Decimal("9.90"), currency="EUR", account="acc")]
    for event in events:
        stored = encode_event(event, "t1")
        replayed = CODEC.decode_state(stored.topic, stored.originator_id, event.version, orjson.loads(stored.state))
        assert replayed == CODEC.decode_event(stored.topic, stored.originator_id, event.version, stored.state).event
        assert replayed == event and type(replayed.event_id) is type(event.event_id)

    shared = {"quantity": 5}  # an upcaster returning a dict of its own (here: always the same one)
    stored = encode_event(events[0], "t1")
    monkeypatch.setattr(StockReceived, "class_version", 2, raising=False)
    monkeypatch.setattr(StockReceived, "upcast_v1_v2", staticmethod(lambda d: shared), raising=False)
    for _ in range(2):
        assert CODEC.decode_state(stored.topic, stored.originator_id, 3, orjson.loads(stored.state)).quantity == 5
    assert shared == {"quantity": 5}


def test_an_event_class_s_own_upcast_runs_on_a_replay_at_its_current_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from commitline.examples.inventory import StockReceived

    event = StockReceived(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                          quantity=1)
    stored = encode_event(event, "t1")
    monkeypatch.setattr(StockReceived, "upcast", classmethod(lambda cls, d, v: {**d, "quantity": d["quantity"] * 10}))
    assert CODEC.decode_state(stored.topic, stored.originator_id, 1, orjson.loads(stored.state)).quantity == 10


def test_an_event_its_upcasters_bring_to_an_unfitting_shape_names_the_upcasters_not_a_new_one() -> None:
    from pydantic import TypeAdapter, ValidationError

    from commitline.domain.aggregate import Event
    from commitline.infrastructure.store.codec import unfitting

    class LoanDue(Event):
        class_version = 3
        due: str

        @staticmethod
        def upcast_v1_v2(data: dict) -> dict:
            return data

        @staticmethod
        def upcast_v2_v3(data: dict) -> dict:
            return {**data, "due": 5}  # the defect: not a str

    try:
        TypeAdapter(str).validate_python(5)
    except ValidationError as e:
        error = e
    stream = uuid4()
    upcast = str(unfitting(LoanDue, "LoanDue", stream, 2, 1, error))
    assert upcast.startswith(f"the domain: the LoanDue event at version 2 of stream {stream}, stored at class_version "
                             "1, does not fit "), upcast
    assert "The upcasters from class_version 1 to 3 (upcast_v1_v2 first) must give a payload" in upcast
    current = str(unfitting(LoanDue, "LoanDue", stream, 2, 3, error))  # a stored value of another type
    assert "A field whose type changed needs" in current and "upcast_v3_v4" in current
    try:
        TypeAdapter(LoanDue).validate_python({})
    except ValidationError as e:
        missing = str(unfitting(LoanDue, "LoanDue", stream, 2, 3, e))  # a field the stored event lacks
    assert "A field added to an event class needs a default" in missing and "upcast_v3_v4" in missing
