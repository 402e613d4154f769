"""The publish group's rebalancing decisions (``followers/group.plan_rebalance``), pure: fair shares from the
live members alone, a surplus handed over only while someone is short, unowned buckets taken below the share,
and at the share only a bucket left unowned past the grace period, one per round."""

from __future__ import annotations

from commitline.infrastructure.followers.group import UNOWNED_GRACE_SECONDS, GroupState, fair_share, plan_rebalance


def test_fair_shares_add_up_and_differ_by_at_most_one() -> None:
    for buckets in (1, 7, 16, 64):
        for count in range(1, 10):
            members = [100 + 7 * i for i in range(count)]
            shares = [fair_share(buckets, members, m) for m in members]
            assert sum(shares) == buckets
            assert max(shares) - min(shares) <= 1
            assert shares == sorted(shares, reverse=True)  # the lowest pids take the extra ones


def test_a_member_above_its_share_hands_over_its_highest_buckets_while_another_is_short() -> None:
    state = GroupState(members=[1, 2], owners={b: 1 for b in range(8)}, me=1)
    plan = plan_rebalance(state, 8, range(8), {}, now=0.0)
    assert plan.hand_over == [4, 5, 6, 7]  # bucket 0 stays: its owner keeps the group's row
    assert plan.candidates == [] and plan.wanted == 0


def test_a_surplus_is_handed_over_only_while_another_member_is_short() -> None:
    # 16 buckets, 2 members, 8 each: 9 and 7 is one too many here; 8 and 8 is nothing to do.
    state = GroupState(members=[1, 2], owners={**{b: 1 for b in range(9)}, **{b: 2 for b in range(9, 16)}}, me=1)
    assert plan_rebalance(state, 16, range(9), {}, now=0.0).hand_over == [8]
    state = GroupState(members=[1, 2], owners={**{b: 1 for b in range(8)}, **{b: 2 for b in range(8, 16)}}, me=1)
    assert plan_rebalance(state, 16, range(8), {}, now=0.0).hand_over == []


def test_a_member_below_its_share_takes_unowned_buckets_up_to_it() -> None:
    state = GroupState(members=[1, 2], owners={0: 1, 1: 1, 2: 1, 3: 1}, me=2)
    plan = plan_rebalance(state, 8, [], {}, now=0.0)
    assert plan.hand_over == []
    assert sorted(plan.candidates) == [4, 5, 6, 7] and plan.wanted == 4 and plan.share == 4


def test_at_its_share_a_member_takes_only_a_bucket_unowned_past_the_grace_period_one_per_round() -> None:
    state = GroupState(members=[1, 2], owners={**{b: 1 for b in range(4)}, 4: 2, 5: 2}, me=1)
    since: dict[int, float] = {}
    first = plan_rebalance(state, 8, range(4), since, now=10.0)
    assert first.candidates == [] and first.wanted == 0
    assert since == {6: 10.0, 7: 10.0}  # unowned from now on
    later = plan_rebalance(state, 8, range(4), since, now=10.0 + UNOWNED_GRACE_SECONDS)
    assert later.candidates == [6] and later.wanted == 1
    owned_again = GroupState(members=[1, 2], owners={**state.owners, 6: 2, 7: 2}, me=1)
    plan_rebalance(owned_again, 8, range(4), since, now=20.0)
    assert since == {}  # a bucket owned again is no longer waited for
