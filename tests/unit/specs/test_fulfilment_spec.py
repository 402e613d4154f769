"""OrderFulfilment, the saga's own record: reserve -> charge -> confirm; a failed step
moves it to COMPENSATING, the touched steps are undone latest first, then it is cancelled
(COMPENSATED). A compensation that keeps failing leaves it STUCK until an operator retries; a saga whose
advance keeps failing unexpectedly is PARKED and resumes where it was on an operator's retry."""

from __future__ import annotations

from itertools import product
from uuid import uuid4

import pytest

from commitline.domain.errors import IllegalTransition, InvalidValue
from commitline.examples.fulfilment import (
    AFTER_STEP,
    SAGA_TRANSITIONS,
    STEPS,
    FulfilmentCancelled,
    FulfilmentCompensated,
    FulfilmentNotWaiting,
    FulfilmentParked,
    FulfilmentRetried,
    FulfilmentStarted,
    FulfilmentStepCompleted,
    FulfilmentStepFailed,
    FulfilmentStuck,
    OrderFulfilment,
    SagaState,
    fulfilment_id,
    payment_id_for,
)
from commitline.testing import event, given

S = SagaState
ORDER = uuid4()
STARTED = event(FulfilmentStarted, order_id=ORDER)
RESERVED = event(FulfilmentStepCompleted, step="reserve", detail="2 held")
AUTHORIZED = event(FulfilmentStepCompleted, step="charge", detail="auth-1")
CONFIRMED = event(FulfilmentStepCompleted, step="confirm", detail="captured")
CHARGE_FAILED = event(FulfilmentStepFailed, step="charge", reason="declined")
CHARGE_UNDONE = event(FulfilmentCompensated, step="charge", detail="voided")
RESERVE_UNDONE = event(FulfilmentCompensated, step="reserve", detail="released")
STUCK = event(FulfilmentStuck, step="reserve", reason="inventory down", attempts=5)
COMPENSATING = (STARTED, RESERVED, CHARGE_FAILED)


def saga(*facts):
    return given(OrderFulfilment, *facts, id=fulfilment_id(ORDER))


def test_ids_derive_from_the_order_and_never_collide() -> None:
    assert fulfilment_id(ORDER) == fulfilment_id(ORDER) and payment_id_for(ORDER) == payment_id_for(ORDER)
    assert len({fulfilment_id(ORDER), payment_id_for(ORDER), ORDER, fulfilment_id(uuid4())}) == 4


def test_start_opens_the_saga_under_the_derived_id() -> None:
    started = saga().when(lambda _: OrderFulfilment.start(ORDER)).then(STARTED)
    assert (started.id, started.order_id, started.next_step) == (fulfilment_id(ORDER), ORDER, "reserve")
    assert started.fsm_states() == {"saga": "STARTED"}


@pytest.mark.parametrize(("done", "step", "state"), [
    ((STARTED,), "reserve", S.RESERVED),
    ((STARTED, RESERVED), "charge", S.AUTHORIZED),
    ((STARTED, RESERVED, AUTHORIZED), "confirm", S.COMPLETED),
])
def test_each_step_completes_in_turn(done, step: str, state: SagaState) -> None:
    after = saga(*done).when(lambda s: s.step_completed(step, "ok")).then(
        event(FulfilmentStepCompleted, step=step, detail="ok")
    )
    assert after.state is state is AFTER_STEP[step]
    assert after.completed == list(STEPS[: STEPS.index(step) + 1])


def test_a_completed_saga_has_no_next_step() -> None:
    done = saga(STARTED, RESERVED, AUTHORIZED, CONFIRMED)
    assert done.aggregate().next_step is None
    done.when(lambda s: s.step_completed("confirm", "again")).then_raises(InvalidValue, field="step", value="confirm")
    done.when(lambda s: s.step_failed("confirm", "late")).then_raises(InvalidValue, field="step")


@pytest.mark.parametrize("step", ["charge", "confirm", "ship"])
def test_steps_are_taken_in_order(step: str) -> None:
    error = saga(STARTED).when(lambda s: s.step_completed(step, "x")).then_raises(InvalidValue, field="step", value=step)
    assert error.reason == "the next step is reserve"


def test_a_failed_step_starts_compensation_of_everything_touched_latest_first() -> None:
    failed = saga(STARTED, RESERVED).when(lambda s: s.step_failed("charge", "declined")).then(CHARGE_FAILED)
    assert (failed.state, failed.failed_step, failed.failure) == (S.COMPENSATING, "charge", "charge: declined")
    assert failed.to_compensate == ["charge", "reserve"]


def test_a_failed_first_step_is_itself_undone() -> None:
    failed = saga(STARTED).when(lambda s: s.step_failed("reserve", "timeout")).then(
        event(FulfilmentStepFailed, step="reserve", reason="timeout")
    )
    assert failed.to_compensate == ["reserve"]


def test_compensations_run_latest_first() -> None:
    saga(*COMPENSATING).when(lambda s: s.compensated_step("reserve", "released")).then_raises(
        InvalidValue, field="step", value="reserve"
    )
    undone = saga(*COMPENSATING).when(lambda s: s.compensated_step("charge", "voided")).then(CHARGE_UNDONE)
    assert (undone.state, undone.to_compensate) == (S.COMPENSATING, ["reserve"])
    undone = saga(*COMPENSATING, CHARGE_UNDONE).when(lambda s: s.compensated_step("reserve", "released")).then(
        RESERVE_UNDONE
    )
    assert undone.to_compensate == []


def test_nothing_is_compensated_outside_compensation() -> None:
    saga(STARTED, RESERVED).when(lambda s: s.compensated_step("reserve", "released")).then_raises(
        InvalidValue, field="step", value="reserve"
    )


def test_cancelled_only_once_every_touched_step_is_undone() -> None:
    saga(*COMPENSATING, CHARGE_UNDONE).when(lambda s: s.cancelled("declined")).then_raises(
        InvalidValue, field="compensation", value=["reserve"]
    )
    over = saga(*COMPENSATING, CHARGE_UNDONE, RESERVE_UNDONE).when(lambda s: s.cancelled("declined")).then(
        event(FulfilmentCancelled, reason="declined")
    )
    assert over.state is S.COMPENSATED and over.fsm_states() == {"saga": "COMPENSATED"}


def test_a_compensated_saga_is_over() -> None:
    over = saga(STARTED, event(FulfilmentStepFailed, step="reserve", reason="t"),
                event(FulfilmentCompensated, step="reserve", detail="r"), event(FulfilmentCancelled, reason="t"))
    over.when(lambda s: s.step_failed("reserve", "again")).then_raises(
        IllegalTransition, current="COMPENSATED", requested="COMPENSATING", allowed=()
    )
    over.when(lambda s: s.retry()).then_raises(FulfilmentNotWaiting, order_id=ORDER, state="COMPENSATED")


def test_a_compensation_that_keeps_failing_parks_the_saga() -> None:
    stuck = saga(*COMPENSATING, CHARGE_UNDONE).when(lambda s: s.stuck_at("reserve", "inventory down", 5)).then(STUCK)
    assert (stuck.state, stuck.stuck) == (S.STUCK, "reserve: inventory down")


def test_an_operator_retry_resumes_compensation_naming_the_order() -> None:
    resumed = saga(*COMPENSATING, CHARGE_UNDONE, STUCK).when(lambda s: s.retry()).then(
        event(FulfilmentRetried, order_id=ORDER, resumed=S.COMPENSATING))
    assert (resumed.state, resumed.stuck, resumed.to_compensate) == (S.COMPENSATING, None, ["reserve"])


def test_only_a_stuck_saga_is_retried_and_only_compensation_gets_stuck() -> None:
    # running (a retry would cancel it), compensating, or done: none waits for a person
    for before in ((STARTED,), (STARTED, RESERVED), (STARTED, RESERVED, AUTHORIZED), COMPENSATING):
        state = saga(*before).aggregate().state.value
        saga(*before).when(lambda s: s.retry()).then_raises(FulfilmentNotWaiting, order_id=ORDER, state=state)
    saga(STARTED, RESERVED).when(lambda s: s.stuck_at("charge", "x", 1)).then_raises(
        IllegalTransition, current="RESERVED", requested="STUCK", allowed=("AUTHORIZED", "COMPENSATING", "PARKED")
    )


PARKED = event(FulfilmentParked, order_id=ORDER, reason="RuntimeError: adapter bug", attempts=3)


@pytest.mark.parametrize("before", [(STARTED,), (STARTED, RESERVED), (STARTED, RESERVED, AUTHORIZED), COMPENSATING])
def test_a_parked_saga_resumes_where_it_was(before: tuple) -> None:
    where = saga(*before).aggregate().state
    parked = saga(*before).when(lambda s: s.park(ORDER, "RuntimeError: adapter bug", 3)).then(PARKED)
    assert (parked.state, parked.stuck, parked.parked_from) == (S.PARKED, "RuntimeError: adapter bug", where)
    resumed = saga(*before, PARKED).when(lambda s: s.retry()).then(
        event(FulfilmentRetried, order_id=ORDER, resumed=where))
    assert (resumed.state, resumed.stuck, resumed.parked_from) == (where, None, None)


def test_a_saga_parked_before_it_started_is_started_and_parked_at_once() -> None:
    parked = saga().when(lambda s: s.park(ORDER, "boom", 2)).then(
        STARTED, event(FulfilmentParked, order_id=ORDER, reason="boom", attempts=2))
    assert parked.state is S.PARKED and parked.parked_from is S.STARTED


def test_a_parked_saga_takes_no_step_and_finished_ones_cannot_be_parked() -> None:
    saga(STARTED, PARKED).when(lambda s: s.step_completed("reserve", "x")).then_raises(InvalidValue, field="step")
    saga(STARTED, RESERVED, AUTHORIZED, CONFIRMED).when(lambda s: s.park(ORDER, "x", 1)).then_raises(
        IllegalTransition, current="COMPLETED", requested="PARKED")


def test_a_saga_never_started_cannot_move() -> None:
    saga().when(lambda s: s.step_completed("reserve", "x")).then_raises(IllegalTransition, current="NEW")
    saga().when(lambda s: s.retry()).then_raises(IllegalTransition, current="NEW", requested="COMPENSATING")


def test_the_table_is_exactly_the_documented_one() -> None:
    forward = {(S.STARTED, S.RESERVED), (S.RESERVED, S.AUTHORIZED), (S.AUTHORIZED, S.COMPLETED)}
    failing = {(s, S.COMPENSATING) for s in (S.STARTED, S.RESERVED, S.AUTHORIZED, S.STUCK)}
    ending = {(S.COMPENSATING, S.COMPENSATED), (S.COMPENSATING, S.STUCK)}
    live = (S.STARTED, S.RESERVED, S.AUTHORIZED, S.COMPENSATING)
    parking = {(s, S.PARKED) for s in live} | {(S.PARKED, s) for s in live}
    assert {(s, t) for s, t in product(S, S) if SAGA_TRANSITIONS.can(s, t)} == forward | failing | ending | parking
    assert OrderFulfilment.TRANSITIONS is SAGA_TRANSITIONS and set(AFTER_STEP) == set(STEPS)
