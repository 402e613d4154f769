"""The audit prints an aggregate's state with its sets in one order, so equal states print equal: also a set of
members that have no order of their own (enum members)."""

from __future__ import annotations

from enum import Enum
from uuid import uuid4

from commitline import Aggregate, Event
from commitline.application.audit import state_of


class Tier(Enum):
    GOLD = 1
    SILVER = 2
    BRONZE = 3


class Promoted(Event):
    tier: int


class Member(Aggregate):
    tiers: frozenset[Tier] = frozenset()
    scores: frozenset[int] = frozenset()

    EVENTS = (Promoted,)

    def _evolve(self, event: Event) -> None:
        pass


def test_a_set_of_enum_members_prints_in_one_order_and_numbers_in_theirs() -> None:
    one, other = Member.blank(uuid4()), Member.blank(uuid4())
    one.tiers, other.tiers = frozenset([Tier.SILVER, Tier.GOLD, Tier.BRONZE]), frozenset([Tier.BRONZE, Tier.GOLD,
                                                                                           Tier.SILVER])
    one.scores = other.scores = frozenset([10, 9, 100])
    assert state_of(one)["tiers"] == state_of(other)["tiers"] == [3, 1, 2]  # BRONZE, GOLD, SILVER: by name
    assert state_of(one)["scores"] == [9, 10, 100]
