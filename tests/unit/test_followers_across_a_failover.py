"""What a follower instance keeps in memory across a failover: the slots it stopped, and the gaps it was proving."""

from __future__ import annotations

from commitline.infrastructure.followers.slots import OwnedSlots
from commitline.infrastructure.store.log import NotificationLog
from commitline.infrastructure.store.schema import EventTables


def test_a_slot_stopped_here_then_let_go_on_by_an_operator_under_another_instance_waits_no_more() -> None:
    slots = OwnedSlots()
    slots._stopped = {3, 5}  # stopped here at a poison event or because the store went back, then handed over
    slots._others = {3: (40, "failed"), 5: (40, "failed")}
    assert slots.waiting_for_operator
    slots._others = {3: (40, "running"), 5: (40, "failed")}  # an operator reset bucket 3; its owner runs it
    assert slots.waiting_for_operator
    slots._others = {3: (40, "running"), 5: (41, "running")}
    assert not slots.waiting_for_operator


def test_forgetting_the_gaps_makes_each_one_proven_anew() -> None:
    log = NotificationLog(EventTables("s"), connection=lambda: None)  # type: ignore[arg-type,return-value]
    xids = iter([1000, 20])
    log._fresh_xid = lambda: next(xids)  # type: ignore[method-assign]
    assert log.first_unproven_gap([7], xmin=5) == 7  # met on the old server: its bound is xid 1000 there
    log.forget_gaps()  # joined again, maybe on a promoted standby whose xids went back
    assert log.gaps_seen() == set()
    assert log.first_unproven_gap([7], xmin=5) == 7  # noted again, with a bound of the server read now
    assert log.first_unproven_gap([7], xmin=21) is None  # proven there, without waiting for xid 1000
