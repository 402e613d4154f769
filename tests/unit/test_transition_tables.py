"""Every (state, target) pair of every transition table: allowed pairs move, the rest raise
IllegalTransition naming the aggregate, both states and the allowed targets."""

from __future__ import annotations

from decimal import Decimal
from dataclasses import dataclass, field
from enum import Enum
from itertools import product
from uuid import uuid4

import pytest

from commitline import Aggregate, Event, transitions
from commitline.domain.errors import IllegalTransition
from commitline.testing import event, given
from commitline.examples.inventory import RESERVATION_TRANSITIONS, InventoryItem, ReservationState
from commitline.examples.payments import PAYMENT_TRANSITIONS, PaymentState, PaymentTransaction
from commitline.examples.surveys import (
    ASSIGNMENT_TRANSITIONS,
    TASK_TRANSITIONS,
    AssignmentStatus,
    SurveyAssignment,
    SurveyTask,
    TaskState,
    assignment_id,
)

P = PaymentState
EXPECTED_PAYMENT = {(P.CREATED, P.PENDING), (P.PENDING, P.COMPLETED), (P.PENDING, P.FAILED), (P.FAILED, P.PENDING)}


def test_payment_table_is_exactly_the_seed_table() -> None:
    allowed = {(s, t) for s in P for t in P if PAYMENT_TRANSITIONS.can(s, t)}
    assert allowed == EXPECTED_PAYMENT


def payment_in(state: PaymentState) -> PaymentTransaction:
    payment = PaymentTransaction.create(uuid4(), amount=Decimal("10.00"), currency="EUR", account="acc-1")
    path = {
        P.CREATED: [],
        P.PENDING: [lambda p: p.submit()],
        P.COMPLETED: [lambda p: p.submit(), lambda p: p.complete()],
        P.FAILED: [lambda p: p.submit(), lambda p: p.fail("declined")],
    }[state]
    for step in path:
        step(payment)
    payment.collect_events()
    assert payment.state is state
    return payment


MOVES = {P.PENDING: lambda p: p.submit(), P.COMPLETED: lambda p: p.complete(), P.FAILED: lambda p: p.fail("x")}


@pytest.mark.parametrize(("current", "target"), [(s, t) for s, t in product(P, P) if t is not P.CREATED])
def test_every_payment_pair(current: PaymentState, target: PaymentState) -> None:
    payment = payment_in(current)
    version = payment.version
    if (current, target) in EXPECTED_PAYMENT:
        MOVES[target](payment)
        assert payment.state is target
        assert payment.version == version + 1
        assert len(payment.collect_events()) == 1
    else:
        with pytest.raises(IllegalTransition) as caught:
            MOVES[target](payment)
        e = caught.value
        assert (e.aggregate, e.current, e.requested) == ("PaymentTransaction", current.value, target.value)
        assert set(e.allowed) == {t.value for s, t in EXPECTED_PAYMENT if s is current}
        assert payment.state is current and payment.version == version
        assert payment.collect_events() == []


def test_failed_to_completed_names_the_state_and_allowed_targets() -> None:
    with pytest.raises(IllegalTransition, match="from FAILED to COMPLETED; allowed from FAILED: PENDING"):
        payment_in(P.FAILED).complete()


R = ReservationState


def item_with_reservation_in(state: ReservationState) -> InventoryItem:
    item = InventoryItem.receive_new(uuid4(), 5)
    item.reserve("r1", 2)
    if state is R.RELEASED:
        item.release("r1")
    if state is R.FULFILLED:
        item.fulfil("r1")
    item.collect_events()
    return item


@pytest.mark.parametrize(("current", "target"), [(s, t) for s in R for t in (R.RELEASED, R.FULFILLED)])
def test_every_reservation_pair(current: ReservationState, target: ReservationState) -> None:
    item = item_with_reservation_in(current)
    move = item.release if target is R.RELEASED else item.fulfil
    if RESERVATION_TRANSITIONS.can(current, target):
        assert current is R.RESERVED
        move("r1")
        assert item.reservations["r1"].state is target
    else:
        with pytest.raises(IllegalTransition) as caught:
            move("r1")
        assert caught.value.aggregate == "Reservation"
        assert caught.value.current == current.value


def test_task_and_assignment_tables() -> None:
    assert {(s, t) for s in TaskState for t in TaskState if TASK_TRANSITIONS.can(s, t)} == {
        (TaskState.OPEN, TaskState.CLOSED)
    }
    assert {(s, t) for s in AssignmentStatus for t in AssignmentStatus if ASSIGNMENT_TRANSITIONS.can(s, t)} == {
        (AssignmentStatus.PENDING, AssignmentStatus.DONE)
    }
    task = SurveyTask.create(uuid4(), "T")
    task.close()
    with pytest.raises(IllegalTransition):
        task.close()


def test_a_user_answers_at_most_once() -> None:
    task = SurveyTask.create(uuid4(), "T")
    task.issue(["u1"])
    assignment = SurveyAssignment.blank(assignment_id(task.id, "u1"))
    assignment.answer(task, "u1")
    with pytest.raises(IllegalTransition) as caught:
        assignment.answer(task, "u1")
    assert (caught.value.current, caught.value.requested) == ("DONE", "DONE")


class Job(str, Enum):
    OPEN = "OPEN"
    DONE = "DONE"


class JobOpened(Event):
    pass


class JobFinished(Event):
    pass


class JobReopened(Event):
    pass


class JobNoted(Event):
    note: str


class Entry(str, Enum):
    ON = "ON"
    OFF = "OFF"


@dataclass
class Switch:
    state: Entry


class EntryAdded(Event):
    key: str


class EntryFlipped(Event):
    key: str
    to: Entry


class Jobs(Aggregate):
    """One machine (``state``) moved by events whose ``_evolve`` sets it, and a per-entry machine (``switches``)."""

    state: Job | None = None
    EVENTS = (JobOpened, JobFinished, JobReopened, JobNoted)
    TRANSITIONS = transitions({Job.OPEN: {Job.DONE}, Job.DONE: set()})

    def _evolve(self, event: Event) -> None:
        match event:
            case JobOpened() | JobReopened():
                self.state = Job.OPEN
            case JobFinished():
                self.state = Job.DONE
            case JobNoted():
                pass


class Switches(Aggregate):
    switches: dict[str, Switch] = field(default_factory=dict)
    EVENTS = (EntryAdded, EntryFlipped)
    TRANSITIONS = transitions({Entry.ON: {Entry.OFF}, Entry.OFF: set()})
    MACHINE = ("switch", "switches")

    def _evolve(self, event: Event) -> None:
        match event:
            case EntryAdded(key=key):
                self.switches[key] = Switch(Entry.ON)
            case EntryFlipped(key=key, to=to):
                self.switches[key].state = to


def test_an_event_emitted_without_move_is_still_checked_against_the_table() -> None:
    job = Jobs(id=uuid4())
    job._emit(JobOpened)  # the first state is free
    job._emit(JobNoted, note="no move")  # an event that leaves the state where it is moves nothing
    job._emit(JobFinished)  # OPEN -> DONE, in the table, though not made with _move
    with pytest.raises(IllegalTransition) as refused:
        job._emit(JobReopened)  # DONE -> OPEN: not in the table
    assert (refused.value.current, refused.value.requested, refused.value.allowed) == ("DONE", "OPEN", ())
    assert (job.state, job.version, len(job.collect_events())) == (Job.DONE, 3, 3)  # as before the refused event
    given(Jobs, event(JobOpened), event(JobFinished)).when(lambda j: j._emit(JobReopened)).then_raises(
        IllegalTransition, current="DONE", requested="OPEN")


def test_a_move_whose_event_lands_elsewhere_is_a_defect_of_the_domain() -> None:
    job = Jobs(id=uuid4())
    job._emit(JobOpened)
    with pytest.raises(RuntimeError, match=r"Jobs\._move to DONE: its JobReopened left the machine at OPEN"):
        job._move(Job.DONE, JobReopened)  # OPEN -> DONE is allowed, but the event's _evolve keeps it OPEN


def test_a_per_entry_machine_checks_each_entry_that_moves() -> None:
    switches = Switches(id=uuid4())
    switches._emit(EntryAdded, key="a")
    switches._emit(EntryAdded, key="b")
    switches._emit(EntryFlipped, key="a", to=Entry.OFF)
    with pytest.raises(IllegalTransition) as refused:
        switches._emit(EntryFlipped, key="a", to=Entry.ON)
    assert (refused.value.current, refused.value.requested) == ("OFF", "ON")
    assert len(switches.collect_events()) == 3  # the refused event is not kept
    assert {key: s.state for key, s in switches.switches.items()} == {"a": Entry.OFF, "b": Entry.ON}
    assert switches.version == 3
