"""What ``status`` calls a follower, and what ``status --check`` counts as unhealthy: pure rules, no I/O."""

from __future__ import annotations

from uuid import UUID

from datetime import datetime, timezone
from typing import Any

import pytest

from commitline.application.process import StuckInstance
from commitline.infrastructure.followers.health import Problem, Thresholds, follower_reasons, judge
from commitline.infrastructure.followers.status import Backend, FollowerStatus, derive_status

LIMITS = Thresholds(max_lag_events=100, max_lag_seconds=30)
LIVE = Backend(4242, "commitline x", datetime(2026, 1, 1, tzinfo=timezone.utc), None)


def follower(name: str = "x", status: str = "running", *, alive: bool = True, lag: int = 0, lag_s: float = 0.0,
             error: dict[str, Any] | None = None, owner: str | None = "host:1") -> FollowerStatus:
    recorded = None if status == "never run" else ("running" if status == "dead" else status)
    return FollowerStatus(name, status, owner, 10, 10 + lag, lag, lag_s, None, error, recorded,
                          LIVE if alive else None, 1.0)


@pytest.mark.parametrize(("recorded", "held", "shown"), [
    (None, False, "never run"),
    (None, True, "running"),  # the lock is taken a moment before the row is written
    ("running", True, "running"),
    ("retrying", True, "retrying"),
    ("failed", True, "failed"),
    ("running", False, "dead"),  # a SIGKILLed owner's row still says running
    ("retrying", False, "dead"),
    ("failed", False, "failed"),  # stopped at a poison event whether or not a process waits
    ("stopped", False, "stopped"),
    ("yielded", False, "yielded"),
    ("stopped", True, "running"),  # a new owner holds the lock and is about to claim the row
])
def test_the_shown_status_comes_from_the_lock_not_the_row(recorded: str | None, held: bool, shown: str) -> None:
    assert derive_status(recorded, held) == shown


def test_a_dead_follower_names_its_last_owner() -> None:
    assert follower_reasons(follower(status="dead", alive=False, owner="web-1:77"), LIMITS) == [
        "dead: no live session holds its lease (last owner web-1:77, recorded running)"]


def test_a_poison_event_and_a_retry_show_their_error() -> None:
    poisoned = follower(status="failed", error={"position": 7, "event_type": "PaymentSubmitted",
                                                "message": "LookupError: no payment"})
    assert follower_reasons(poisoned, LIMITS) == ["stopped at poison event 7 (PaymentSubmitted): LookupError: no "
                                                  "payment; waiting for an operator's retry or skip"]
    retrying = follower(status="retrying", error={"position": 9, "message": "KafkaConnectionError: down"})
    assert follower_reasons(retrying, LIMITS) == ["retrying at position 9: KafkaConnectionError: down"]


def test_a_projection_whose_tables_need_a_rebuild_says_so_not_poison() -> None:
    """Its tables differ from what it declares: the remedy is the rebuild its message names, not a retry or skip."""
    message = ("projection loan_book needs a rebuild: its tables differ from what it declares (rm_loans.purpose is "
               "missing); run `commitline projections rebuild loan_book`")
    refused = follower(status="failed", error={"message": message, "position": 14, "needs_rebuild": [
        "rm_loans.purpose is missing"], "command": "commitline projections rebuild loan_book"})
    assert follower_reasons(refused, LIMITS) == [f"stopped before its tables: {message}"]


def test_a_stop_that_asked_for_a_new_generation_asks_only_for_the_reset_once_one_began() -> None:
    """The publisher found the broker ahead of the store before anyone started a new generation: its error says
    to start one, then reset. Once the store is at a newer generation than the stop saw, only the reset is left."""
    from dataclasses import replace

    error = {"kind": "store_went_back", "reason": "Kafka holds notification 9", "position": 7, "generation": 1,
             "what_to_do": "commitline store new-generation --reason TEXT, then commitline followers reset "
                           "kafka-publisher --from-head | --from N | --keep"}
    from commitline.infrastructure.followers.buckets import bucket_name

    stopped = follower(bucket_name("kafka-publisher", 0, 16), status="failed", error=error)
    assert "commitline store new-generation" in follower_reasons(stopped, LIMITS)[0]
    begun = replace(stopped, older_generation=(1, 2))
    assert follower_reasons(begun, LIMITS) == [
        "stopped at position 7: the store went back: Kafka holds notification 9; waiting for an operator: "
        "commitline followers reset kafka-publisher --from-head | --from N | --keep"]


@pytest.mark.parametrize(("lag", "lag_s", "unhealthy"), [
    (100, 30.0, False), (101, 0.0, True), (0, 30.5, True), (0, 0.0, False)])
def test_a_live_follower_is_unhealthy_beyond_either_lag_threshold(lag: int, lag_s: float, unhealthy: bool) -> None:
    reasons = follower_reasons(follower(lag=lag, lag_s=lag_s), LIMITS)
    assert bool(reasons) is unhealthy
    if unhealthy:
        assert reasons == [f"lagging by {lag} events / {lag_s:.1f} s (limits 100 events / 30 s)"]


def test_lag_is_not_judged_for_a_rebuild_or_for_nobody_running() -> None:
    assert follower_reasons(follower("x@rebuild", lag=10_000), LIMITS) == []
    assert follower_reasons(follower(status="stopped", alive=False, lag=10_000), LIMITS) == []


def test_stopped_and_never_run_followers_are_unhealthy_only_when_named() -> None:
    followers = [follower("a", "never run", alive=False, owner=None), follower("b", "stopped", alive=False),
                 follower("c")]
    assert judge(followers, [], LIMITS) == []
    assert judge(followers, [], LIMITS, only=["a", "b", "c"]) == [
        Problem("a", "never run"), Problem("b", "stopped: not running (last owner host:1)")]
    assert judge(followers, [], LIMITS, only=["c"]) == []


def test_a_dead_follower_is_judged_only_when_in_scope() -> None:
    followers = [follower("a", "dead", alive=False), follower("b")]
    assert [p.subject for p in judge(followers, [], LIMITS)] == ["a"]
    assert judge(followers, [], LIMITS, only=["b"]) == []


def test_stuck_sagas_count_when_everything_or_their_process_manager_is_judged() -> None:
    order = UUID("00000000-0000-0000-0000-000000000001")
    stuck = [StuckInstance("order-fulfilment", order, "acme", "STUCK", "charge: GatewayUnavailable",
                           subject=f"order {order}", problem="fulfilment STUCK: charge: GatewayUnavailable")]
    expected = [Problem(f"order {order}", "fulfilment STUCK: charge: GatewayUnavailable")]
    assert judge([], stuck, LIMITS) == expected
    assert str(expected[0]) == f"order {order}: fulfilment STUCK: charge: GatewayUnavailable"
    runner = follower("order-fulfilment")
    assert judge([runner], stuck, LIMITS, only=["order-fulfilment"]) == expected
    assert judge([runner], stuck, LIMITS, only=["x"]) == []


def test_a_stuck_instance_is_worded_after_its_saga_unless_its_process_manager_says_otherwise() -> None:
    instance = StuckInstance("refunds", UUID(int=7), "acme", "PARKED", "bank down")
    assert judge([], [instance], LIMITS) == [Problem(f"refunds {UUID(int=7)}", "PARKED: bank down")]


def test_an_error_is_described_by_its_class_once() -> None:
    from aiokafka.errors import KafkaConnectionError

    from commitline.infrastructure.followers.outage import described

    assert described(KafkaConnectionError("Unable to bootstrap from 127.0.0.1:9")) == (
        "KafkaConnectionError: Unable to bootstrap from 127.0.0.1:9")  # its message names the class already
    assert described(OSError("connection refused")) == "OSError: connection refused"
    assert described(TimeoutError()) == "TimeoutError"
