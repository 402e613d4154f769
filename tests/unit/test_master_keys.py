"""``MasterKeys``: the current master key and, during a rolling rotation, the previous one. Data keys are
unwrapped with whichever wrapped them and wrapped under the current one only; a data key under a third key
is refused naming key ids, never key material. ``COMMITLINE_PREVIOUS_MASTER_KEY`` is a secret setting,
checked like ``COMMITLINE_MASTER_KEY``."""

from __future__ import annotations

import base64

import pytest

from commitline import ConfigurationError, WrongMasterKey
from commitline.infrastructure.config import load_settings
from commitline.infrastructure.personal.cipher import PersonalData
from commitline.infrastructure.personal.master import MasterKey, MasterKeys, generate
from commitline.examples import domain as examples
from commitline.infrastructure.store.codec import EventCodec
from tests.unit.keys_in_memory import MemoryKeys, codec
from tests.unit.test_personal_data import payment_created

DATA_KEY = bytes(range(32))


def test_data_keys_of_either_key_are_unwrapped_and_new_ones_wrapped_under_the_current_key() -> None:
    old, new = MasterKey.parse(generate()), MasterKey.parse(generate())
    keys = MasterKeys(new, old)
    under_old = old.wrap(DATA_KEY, "k1", "acme", "s1")
    assert keys.unwrap(under_old, old.key_id, "k1", "acme", "s1") == DATA_KEY
    under_new = keys.wrap(DATA_KEY, "k2", "acme", "s2")
    assert new.unwrap(under_new, new.key_id, "k2", "acme", "s2") == DATA_KEY
    with pytest.raises(WrongMasterKey):
        old.unwrap(under_new, new.key_id, "k2", "acme", "s2")
    assert keys.key_id == new.key_id and keys.key_ids == (new.key_id, old.key_id)


def test_a_data_key_under_a_third_key_is_refused_naming_ids_only() -> None:
    texts = [generate() for _ in range(3)]
    old, new, third = (MasterKey.parse(t) for t in texts)
    with pytest.raises(WrongMasterKey) as refused:
        MasterKeys(new, old).unwrap(third.wrap(DATA_KEY, "k", "acme", "s"), third.key_id, "k", "acme", "s")
    message = str(refused.value) + repr(MasterKeys(new, old))
    assert all(k.key_id in message for k in (old, new, third)) and not any(t in message for t in texts)
    assert "COMMITLINE_PREVIOUS_MASTER_KEY" in message


def test_personal_values_sealed_under_the_old_key_open_with_it_as_the_previous_key() -> None:
    keys = MemoryKeys()
    old, new = MasterKey.parse(generate()), MasterKey.parse(generate())
    before, _ = codec(keys, old)
    event, payment = payment_created()
    stored = before.encode(event, "acme", aggregate=payment)
    personal = PersonalData(keys, lambda: new, previous=old)  # type: ignore[arg-type]
    rolled = EventCodec(examples.check().registry, personal)
    assert rolled.decode_event(stored.topic, stored.originator_id, 1, stored.state).event.account == event.account
    other, other_payment = payment_created()
    rolled.encode(other, "globex", aggregate=other_payment)
    assert {r.master_key_id for r in keys.rows.values()} == {old.key_id, new.key_id}
    assert keys.rows[("globex", str(other_payment.id))].master_key_id == new.key_id


@pytest.mark.parametrize("value", ["not base64!", base64.b64encode(b"short").decode()])
def test_a_malformed_previous_key_names_its_variable_never_the_value(value: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_settings({"COMMITLINE_MASTER_KEY": generate(), "COMMITLINE_PREVIOUS_MASTER_KEY": value})
    assert refused.value.variable == "COMMITLINE_PREVIOUS_MASTER_KEY" and value not in str(refused.value)


def test_the_previous_key_is_a_secret_setting() -> None:
    key = generate()
    settings = load_settings({"COMMITLINE_PREVIOUS_MASTER_KEY": key})
    assert key not in repr(settings) and key not in str(settings.model_dump())
    assert settings.previous_master_key is not None and settings.previous_master_key.get_secret_value() == key
