"""Personal fields: declared on events with ``Personal``, checked when the domain is loaded (file and line),
sealed by the codec under their subject's data key before anything is stored, opened on decode, and read as
``ERASED`` once that key is gone. The data keys live in memory here (``MemoryKeys``); the integration tests
run the same code on PostgreSQL."""

from __future__ import annotations

import base64
import inspect
import re
from datetime import datetime, timezone
from decimal import Decimal
from typing import Annotated
from uuid import UUID, uuid4

import orjson
import pytest

from commitline import ERASED, Aggregate, ConfigurationError, Domain, Erased, Event, InvalidDomain, Personal
from commitline import WrongMasterKey
from commitline.domain.personal import personal_fields
from commitline.examples import domain as examples
from commitline.examples.payments import PaymentCreated, PaymentTransaction
from commitline.infrastructure.config import load_settings
from commitline.infrastructure.personal.cipher import PersonalData, SealBroken
from commitline.infrastructure.personal.master import MasterKey, generate
from commitline.infrastructure.store.codec import EventCodec
from tests.unit.keys_in_memory import MemoryKeys, codec


def payment_created(account: str = "GB33BUKB20201555555555") -> tuple[PaymentCreated, PaymentTransaction]:
    event = PaymentCreated(event_id=uuid4(), aggregate_id=uuid4(), version=1,
                           occurred_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
                           amount=Decimal("12.50"), currency="EUR", account=account)
    return event, PaymentTransaction.blank(event.aggregate_id)


# -- declaring ---------------------------------------------------------------------------------------------

class Registered(Event):
    customer_id: str
    email: Annotated[str, Personal(subject="customer_id")]


class Renamed(Event):
    name: Annotated[str, Personal(subject="holder")]  # the aggregate's property


class Customer(Aggregate):
    email: str = ""
    EVENTS = (Registered, Renamed)

    @property
    def holder(self) -> str:
        return str(self.id)

    def _evolve(self, event: Event) -> None:
        pass


class Moved(Event):
    address: Annotated[str, Personal(subject="resident_id")]  # <- no such subject


class Signed(Event):
    name: Annotated[str, Personal(subject="email")]
    email: Annotated[str, Personal(subject="name")]  # <- a personal subject


class Resident(Aggregate):
    EVENTS = (Moved, Signed)

    def _evolve(self, event: Event) -> None:
        pass


def test_personal_fields_are_read_from_the_annotations() -> None:
    assert personal_fields(Registered) == (("email", "customer_id"),)
    assert personal_fields(PaymentCreated) == (("account", "holder"),)
    assert personal_fields(Customer) == () and personal_fields(int) == ()


def test_a_subject_that_is_a_field_of_the_event_or_an_attribute_of_its_aggregate_is_accepted() -> None:
    domain = Domain("customers")
    domain.aggregate(Customer)
    assert domain.check() is domain
    assert examples.check()  # the payments' account, tied to the payment's ``holder``


def test_a_subject_that_does_not_exist_or_is_personal_is_refused_with_its_file_and_line() -> None:
    domain = Domain("residents")
    domain.aggregate(Resident)
    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    lines = inspect.getsource(inspect.getmodule(Moved)).splitlines()  # type: ignore[arg-type]
    found = refused.value.problems
    missing = next(p for p in found if "'resident_id'" in p)
    assert re.search(r"tests/unit/test_personal_data\.py:\d+: event Moved's personal field address names the data "
                     r"subject 'resident_id', which is neither a field of Moved nor an attribute of Resident", missing)
    assert lines[int(missing.split(":")[1]) - 1].startswith("class Moved(Event)")
    personal = next(p for p in found if "Signed" in p)
    assert "a personal field itself" in personal and "test_personal_data.py" in personal


# -- sealing, opening, erasing -----------------------------------------------------------------------------

def test_personal_values_are_sealed_before_storing_and_opened_on_decode() -> None:
    events, keys = codec()
    event, payment = payment_created()
    stored = events.encode(event, "acme", aggregate=payment)
    assert b"GB33BUKB" not in stored.state and b"20201555555555" not in stored.state
    state = orjson.loads(stored.state)
    assert state["pd"] == ["account"] and state["data"]["amount"] == "12.50" and state["data"]["currency"] == "EUR"
    sealed = state["data"]["account"]
    assert set(sealed) == {"ciphertext", "key_id"} and keys.rows[("acme", str(payment.id))].key_id == UUID(
        sealed["key_id"])
    assert len(base64.b64decode(sealed["ciphertext"])) == 12 + len('"GB33BUKB20201555555555"') + 16  # nonce, tag
    back = events.decode_event(stored.topic, stored.originator_id, 1, stored.state)
    assert back.event == event and isinstance(back.event.amount, Decimal)
    again = events.encode(event, "acme", aggregate=payment)
    assert orjson.loads(again.state)["data"]["account"]["ciphertext"] != sealed["ciphertext"]  # a nonce per value


def test_an_erased_subject_reads_as_the_erased_marker_not_an_error() -> None:
    events, keys = codec()
    event, payment = payment_created()
    stored = events.encode(event, "acme", aggregate=payment)
    events.personal.forget([keys.erase("acme", str(payment.id))])  # type: ignore[union-attr]
    back = events.decode_event(stored.topic, stored.originator_id, 1, stored.state).event
    assert back.account is ERASED and isinstance(back.account, Erased) and back.amount == Decimal("12.50")
    assert back.payload()["account"] is ERASED
    assert events.decode_event(stored.topic, stored.originator_id, 1, stored.state).as_dict()["payload"][
        "account"] == {"erased": True}
    fresh, _ = codec(keys)  # another process: the key is not there either
    assert fresh.decode_event(stored.topic, stored.originator_id, 1, stored.state).event.account is ERASED


def test_a_sealed_value_cannot_be_moved_to_another_event_or_tenant() -> None:
    events, _ = codec()
    first, payment = payment_created()
    stored = orjson.loads(events.encode(first, "acme", aggregate=payment).state)
    other = {**stored, "id": str(uuid4())}
    with pytest.raises(SealBroken) as broken:
        events.decode_event("PaymentCreated", first.aggregate_id, 1, orjson.dumps(other))
    assert "GB33" not in str(broken.value)
    with pytest.raises(SealBroken):
        events.decode_event("PaymentCreated", first.aggregate_id, 1, orjson.dumps({**stored, "tenant": "globex"}))


def test_a_subject_of_another_tenant_with_the_same_id_has_its_own_key() -> None:
    events, keys = codec()
    event, payment = payment_created()
    for tenant in ("acme", "globex"):
        events.encode(event, tenant, aggregate=payment)
    assert keys.rows[("acme", str(payment.id))].key_id != keys.rows[("globex", str(payment.id))].key_id


# -- the master key ----------------------------------------------------------------------------------------

def test_a_missing_master_key_is_a_configuration_error_naming_the_variable() -> None:
    def missing() -> MasterKey:
        raise ConfigurationError("COMMITLINE_MASTER_KEY", "is not set")

    keys = MemoryKeys()
    events = EventCodec(examples.check().registry, PersonalData(keys, missing))  # type: ignore[arg-type]
    event, payment = payment_created()
    with pytest.raises(ConfigurationError) as refused:
        events.encode(event, "acme", aggregate=payment)
    assert refused.value.variable == "COMMITLINE_MASTER_KEY" and keys.rows == {}  # no key was made


def test_a_wrong_master_key_is_refused_without_showing_any_key() -> None:
    keys = MemoryKeys()
    right, wrong = generate(), generate()
    events, _ = codec(keys, MasterKey.parse(right))
    event, payment = payment_created()
    stored = events.encode(event, "acme", aggregate=payment)
    other, _ = codec(keys, MasterKey.parse(wrong))
    with pytest.raises(WrongMasterKey) as refused:
        other.decode_event(stored.topic, stored.originator_id, 1, stored.state)
    message = str(refused.value) + repr(refused.value.to_dict())
    assert refused.value.variable == "COMMITLINE_MASTER_KEY" and refused.value.code == "wrong_master_key"
    assert right not in message and wrong not in message and MasterKey.parse(wrong).key_id in message
    assert right not in repr(MasterKey.parse(right))


@pytest.mark.parametrize("value", ["not base64!", base64.b64encode(b"short").decode(), "c2VjcmV0" * 3])
def test_a_malformed_master_key_names_the_variable_never_the_value(value: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_settings({"COMMITLINE_MASTER_KEY": value})
    assert refused.value.variable == "COMMITLINE_MASTER_KEY" and value not in str(refused.value)
    assert "32" in str(refused.value)


def test_the_master_key_is_a_secret_setting() -> None:
    key = generate()
    settings = load_settings({"COMMITLINE_MASTER_KEY": key})
    assert key not in repr(settings) and key not in str(settings.model_dump())
    assert settings.master_key is not None and settings.master_key.get_secret_value() == key


# -- stored outcomes ---------------------------------------------------------------------------------------

def test_a_stored_outcome_holds_the_sealed_form_and_replays_the_same_answer() -> None:
    from commitline.application.dispatching import applied
    from commitline.application.results import DispatchResult
    from commitline.examples.payments import CreatePayment
    from commitline.infrastructure.personal import outcomes

    events, keys = codec()
    event, payment = payment_created()
    payment.apply(event)
    command = CreatePayment(amount=Decimal("12.50"), currency="EUR", account=event.account)
    answer = applied(command, "acme", payment, [event])
    stored = events.encode(event, "acme", aggregate=payment)
    kept = outcomes.protect(answer.outcome_bytes(), [stored])
    assert b"GB33BUKB" not in kept and b'"pd":["account"]' in kept
    replayed = DispatchResult.from_outcome(outcomes.reveal(kept, events.personal))
    assert replayed.model_dump(exclude={"replayed"}) == answer.model_dump(exclude={"replayed"})
    assert outcomes.reveal(b'{"events": []}', None) == b'{"events": []}'  # nothing personal: as it is
    events.personal.forget([keys.erase("acme", str(payment.id))])  # type: ignore[union-attr]
    erased = DispatchResult.from_outcome(outcomes.reveal(kept, events.personal))
    assert erased.events[0].payload == {"amount": "12.50", "currency": "EUR", "account": {"erased": True}}
