"""The audit prints an aggregate's state with its sets in one order, so equal states print equal: also a set of
members that have no order of their own (enum members)."""

from __future__ import annotations

from enum import Enum
from uuid import uuid4

import pytest

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


def test_the_state_as_of_a_time_is_the_events_up_to_the_first_later_one_whatever_the_clocks() -> None:
    """An event's time is its deciding process's clock: two processes' clocks apart may record version 2 before
    version 1. The state as of a moment is then the versions before the first one later than it, never a
    replay with a version left out."""
    from datetime import datetime, timedelta, timezone

    from commitline.application.audit import Auditor, StoredHistoryEvent
    from commitline.application.errors import BeforeCreation

    member = uuid4()
    at = datetime(2026, 11, 30, 10, 0, 5, tzinfo=timezone.utc)
    times = (at, at - timedelta(seconds=1), at + timedelta(seconds=1))  # v2 is recorded a second before v1
    events = [Promoted(event_id=uuid4(), aggregate_id=member, version=v, occurred_at=t, tier=v)
              for v, t in enumerate(times, start=1)]

    class Source:
        def stream(self, aggregate_id: object) -> list[StoredHistoryEvent]:
            return [StoredHistoryEvent(e, "Member", "default") for e in events]

        def first_state(self, aggregate_id: object) -> bytes:
            return b'{"tenant": "default"}'

    auditor = Auditor(Source(), {"Member": Member}, lambda *args: "default")  # type: ignore[arg-type]
    with pytest.raises(BeforeCreation):  # after v2's time, before v1's: v1 decided later, so nothing yet
        auditor.state_as_of(member, at - timedelta(seconds=0.5))
    assert auditor.state_as_of(member, at).version == 2  # v1 at, v2 before it: both; v3 after
    assert auditor.state_as_of(member, at + timedelta(seconds=2)).version == 3


def test_another_tenant_s_stream_is_refused_before_any_of_it_is_read() -> None:
    """A read of another tenant's aggregate answers as an unknown id, and costs as little: only the first event's
    state (its owner) is read, never the stream or its chain, however long the stream is."""
    import orjson

    from commitline.application.audit import Auditor
    from commitline.application.errors import AggregateNotFound

    member, read = uuid4(), []

    class Source:
        def first_state(self, aggregate_id: object) -> bytes:
            read.append("first_state")
            return b'{"tenant": "acme"}'

        def stream(self, aggregate_id: object) -> list:
            read.append("stream")
            return []

        def chain_pages(self, aggregate_id: object) -> list:
            read.append("chain_pages")
            return []

        def witnessing_tenant(self, aggregate_id: object) -> str:
            read.append("witnessing_tenant")
            return "acme"

    auditor = Auditor(Source(), {"Member": Member}, lambda state: orjson.loads(state)["tenant"])  # type: ignore[arg-type]
    for ask in (lambda: auditor.history(member, tenant="globex"), lambda: auditor.current(member, tenant="globex"),
                lambda: auditor.state_at_version(member, 1, tenant="globex"),
                lambda: auditor.diff(member, 0, 1, tenant="globex"), lambda: auditor.verify(member, tenant="globex")):
        read.clear()
        with pytest.raises(AggregateNotFound):
            ask()
        assert read == ["first_state"], read
