"""A snapshot's shape names the code that took it: the same for the same classes, another when the aggregate's
fields, its code or its events change."""

from __future__ import annotations

import importlib
from pathlib import Path
from uuid import uuid4

import pytest

from commitline.examples.inventory import InventoryItem
from commitline.examples.payments import PaymentTransaction
from commitline.infrastructure.store.snapshot_shape import parsed_type, shape_of, stored_type
from tests.domains.evolution import v1, v2


def test_the_same_classes_give_the_same_shape_and_changed_ones_another() -> None:
    assert shape_of(InventoryItem) == shape_of(InventoryItem)
    assert len(shape_of(InventoryItem)) == 16 and int(shape_of(InventoryItem), 16) >= 0
    assert shape_of(v1.Notebook) != shape_of(v2.Notebook)  # another field, another _evolve, another event version
    assert shape_of(InventoryItem) != shape_of(PaymentTransaction)


def test_the_stored_type_holds_the_name_and_the_shape_and_an_older_one_has_none() -> None:
    stored = stored_type("InventoryItem", shape_of(InventoryItem))
    assert parsed_type(stored) == ("InventoryItem", shape_of(InventoryItem))
    assert parsed_type("InventoryItem") == ("InventoryItem", None)  # taken before shapes: never used


def test_a_change_to_a_helper_module_the_aggregate_s_module_uses_gives_another_shape(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_evolve`` calls ``net_of`` from the package's ``policy`` module: a new fee there folds the same events into
    another state, so a snapshot the old rate built must not be used. A module of another package it does not
    use changes nothing."""
    package = f"shape_probe_{uuid4().hex[:8]}"
    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "policy.py").write_text("FEE_RATE = 1\n\ndef net_of(amount):\n    return amount - FEE_RATE\n")
    (root / "aggregate.py").write_text(
        "from commitline import Aggregate, Event\n"
        f"from {package}.policy import net_of\n\n"
        "class Credited(Event):\n    amount: int\n\n"
        "class Account(Aggregate):\n    net: int = 0\n    EVENTS = (Credited,)\n\n"
        "    def _evolve(self, event):\n        self.net += net_of(event.amount)\n")
    (tmp_path / "unrelated.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    account = importlib.import_module(f"{package}.aggregate").Account
    importlib.import_module("unrelated")
    before = shape_of(account)
    (tmp_path / "unrelated.py").write_text("X = 2\n")
    assert shape_of(account) == before
    (root / "policy.py").write_text("FEE_RATE = 2\n\ndef net_of(amount):\n    return amount - FEE_RATE\n")
    assert shape_of(account) != before
