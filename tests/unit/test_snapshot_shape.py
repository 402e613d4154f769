"""A snapshot's shape names the code that took it: the same for the same classes, another when the aggregate's
fields, its code or its events change."""

from __future__ import annotations

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
