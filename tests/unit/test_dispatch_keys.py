"""The idempotency key of a plain ``commitline dispatch`` stdin line: a function of its tenant and
content only, namespaced by ``-k``."""

from __future__ import annotations

import hashlib

import pytest

from commitline.application.boundary import MAX_KEY_LENGTH, check_idempotency_key, read_json
from commitline.application.errors import InvalidIdempotencyKey
from commitline.cli.dispatch import MAX_NAMESPACE_LENGTH, canonical_json, check_namespace, derived_key

COMMAND = {"type": "receive_stock", "item_id": "5f0c5c1e-8d0e-4a8e-9a57-3f1d9d2b7a11", "quantity": 3}


def test_the_key_is_sha256_over_the_tenant_and_the_canonical_command() -> None:
    canonical = b'{"item_id":"5f0c5c1e-8d0e-4a8e-9a57-3f1d9d2b7a11","quantity":3,"type":"receive_stock"}'
    assert canonical_json(COMMAND) == canonical
    assert derived_key(COMMAND, "default") == "sha256:" + hashlib.sha256(b"default\x00" + canonical).hexdigest()


def test_spacing_and_key_order_do_not_change_the_key() -> None:
    respelled = read_json(b'{ "quantity" : 3, "type":"receive_stock",\t"item_id": '
                          b'"5f0c5c1e-8d0e-4a8e-9a57-3f1d9d2b7a11" }')
    assert derived_key(respelled, "default") == derived_key(COMMAND, "default")
    nested = read_json(b'{"type": "x", "a": {"b": 1, "a": [2, {"d": 1, "c": 0}]}}')
    assert canonical_json(nested) == b'{"a":{"a":[2,{"c":0,"d":1}],"b":1},"type":"x"}'


@pytest.mark.parametrize("other", [
    {**COMMAND, "quantity": 4},
    {**COMMAND, "expected_version": 1},
    {**COMMAND, "item_id": "5f0c5c1e-8d0e-4a8e-9a57-3f1d9d2b7a12"},
])
def test_a_different_command_gets_a_different_key(other: dict) -> None:
    assert derived_key(other, "default") != derived_key(COMMAND, "default")


def test_the_tenant_and_the_namespace_are_part_of_the_key() -> None:
    plain = derived_key(COMMAND, "default")
    assert derived_key(COMMAND, "acme") != plain
    assert derived_key(COMMAND, "default", "ns1") == f"ns1:{plain}"
    assert derived_key(COMMAND, "default", "ns2") != derived_key(COMMAND, "default", "ns1")


def test_the_longest_namespace_still_makes_a_usable_key() -> None:
    longest = derived_key(COMMAND, "default", check_namespace("n" * MAX_NAMESPACE_LENGTH))
    assert len(longest) == MAX_KEY_LENGTH and check_idempotency_key(longest, "receive_stock") == longest
    with pytest.raises(InvalidIdempotencyKey, match=str(MAX_NAMESPACE_LENGTH)):
        check_namespace("n" * (MAX_NAMESPACE_LENGTH + 1))
    for unusable in ("", "  ", "a\x01b"):
        with pytest.raises(InvalidIdempotencyKey):
            check_namespace(unusable)
