"""A read model's counters sum exactly in a batch, as the database's ``numeric`` sums them between batches:
so a counter's value never depends on how events fell into batches (live, or in a rebuild's larger ones)."""

from __future__ import annotations

from decimal import Decimal

from commitline.projections.base import Changes, Table

TABLE = Table("rm_totals", {"account": "text", "amount": "numeric", "count": "int8"}, key=("account",),
              counters=("amount", "count"))


def summed(*deltas: Decimal | int) -> Decimal | int:
    changes = Changes({TABLE.name: TABLE})
    for delta in deltas:
        changes.add(TABLE.name, ("a",), amount=delta)
    return changes.rows[TABLE.name][("a",)]["amount"]


def test_decimals_with_more_digits_than_the_default_context_keeps_sum_exactly() -> None:
    wei = Decimal("12345678901.123456789012345678")  # 30 significant digits
    assert summed(wei, wei) == Decimal("24691357802.246913578024691356")
    assert summed(Decimal("9" * 40), 7) == Decimal("1" + "0" * 39 + "6")
    assert summed(Decimal("0.000000000000000000000000000001"), Decimal("1")) == Decimal(
        "1.000000000000000000000000000001")


def test_whole_counters_stay_whole_numbers() -> None:
    assert summed(1, 2, 3) == 6 and type(summed(1, 2, 3)) is int
