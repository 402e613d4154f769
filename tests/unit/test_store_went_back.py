"""What tells a follower that the store went back, and what it then says: pure rules, no I/O."""

from __future__ import annotations

from commitline.infrastructure.followers.health import Thresholds, follower_reasons
from commitline.infrastructure.followers.went_back import went_back
from commitline.infrastructure.kafka.broker_check import LastRecord, _parse, evidence
from tests.unit.test_status_health import follower

STORE = {1: "e1", 2: "e2", 3: "e3"}  # notification id -> event id the store holds


def stored(ids: list[int]) -> dict[int, str]:
    return {n: STORE[n] for n in ids if n in STORE}


def record(n: int, event: str, generation: int = 1, partition: int = 0) -> LastRecord:
    return LastRecord("t.Order", partition, 7, n, event, generation)


def test_records_the_store_holds_are_no_evidence_even_beyond_the_saved_positions() -> None:
    assert evidence([record(3, "e3"), record(2, "e2", partition=1)], 1, stored) is None
    assert evidence([], 1, stored) is None


def test_a_record_the_store_lacks_or_holds_another_event_for_is_evidence() -> None:
    reason, shown = evidence([record(2, "e2"), record(5, "e5", partition=1)], 1, stored)
    assert shown.notification_id == 5 and "no longer has it" in reason
    reason, shown = evidence([record(3, "other")], 1, stored)
    assert shown.notification_id == 3 and "holds another event (e3)" in reason


def test_older_generations_are_history_and_a_newer_one_means_a_restore_from_before_it() -> None:
    assert evidence([record(9, "e9", generation=1)], 2, stored) is None
    reason, shown = evidence([record(1, "e1", generation=3)], 2, stored)
    assert shown.generation == 3 and "restored from before that generation started" in reason


def test_records_without_a_generation_are_of_the_first_and_foreign_ones_are_ignored() -> None:
    parsed = _parse("t.Order", 0, 1, b'{"notification_id": 4, "event_id": "e4"}')
    assert parsed is not None and parsed.generation == 1
    assert _parse("t.Order", 0, 1, b"not json") is None
    assert _parse("t.Order", 0, 1, b'{"something": "else"}') is None


def test_status_says_what_happened_and_which_reset_to_run() -> None:
    error = went_back("kafka-publisher/2of4", "its position 40 is beyond the store's log head 30", position=40,
                      head=30, saved_generation=1, generation=1)
    assert error["what_to_do"] == "commitline followers reset kafka-publisher --from-head | --from N | --keep"
    reasons = follower_reasons(follower("kafka-publisher/2of4", "failed", error=error), Thresholds(100, 30))
    assert reasons == ["stopped at position 40: the store went back: its position 40 is beyond the store's log "
                       "head 30; waiting for an operator: commitline followers reset kafka-publisher --from-head | "
                       "--from N | --keep"]
