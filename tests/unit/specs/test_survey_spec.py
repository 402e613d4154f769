"""Survey tasks (seed 003): a task (OPEN -> CLOSED) issued to batches of users in rounds;
each user answers on their own SurveyAssignment stream (PENDING -> DONE), at most once."""

from __future__ import annotations

from uuid import uuid4

import pytest

from commitline.domain.errors import IllegalTransition, InvalidValue
from commitline.examples.surveys import TaskClosed, UserNotIssued, UsersAlreadyIssued
from commitline.examples.surveys import (
    ISSUE_EVENT_BUDGET,
    MAX_USERS_PER_ISSUE,
    AssignmentStatus,
    SurveyAssignment,
    SurveyTask,
    SurveyTaskAnswered,
    SurveyTaskClosed,
    SurveyTaskCreated,
    SurveyTaskIssued,
    TaskState,
    assignment_id,
    in_parts,
    json_size,
)
from commitline.testing import event, given

TASK_ID = uuid4()
CREATED = event(SurveyTaskCreated, title="Satisfaction")
ISSUED = event(SurveyTaskIssued, round=1, user_ids=("u1", "u2"))
CLOSED = event(SurveyTaskClosed)
OPEN_TASK = given(SurveyTask, CREATED, ISSUED, id=TASK_ID)
CLOSED_TASK = given(SurveyTask, CREATED, ISSUED, CLOSED, id=TASK_ID)


def test_create_opens_the_task() -> None:
    task = given(SurveyTask).when(lambda blank: SurveyTask.create(blank.id, "Satisfaction")).then(CREATED)
    assert task.state is TaskState.OPEN and task.fsm_states() == {"task": "OPEN"}


def test_a_task_needs_a_title() -> None:
    given(SurveyTask).when(lambda blank: SurveyTask.create(blank.id, " ")).then_raises(InvalidValue, field="title")


def test_issue_records_a_round_of_users() -> None:
    task = given(SurveyTask, CREATED).when(lambda t: t.issue(["u1", "u2"])).then(ISSUED)
    assert (task.rounds, task.issued) == (1, frozenset({"u1", "u2"}))


def test_a_reissue_is_the_next_round_and_adds_users() -> None:
    task = OPEN_TASK.when(lambda t: t.issue(("u3",))).then(event(SurveyTaskIssued, round=2, user_ids=("u3",)))
    assert (task.rounds, task.issued) == (2, frozenset({"u1", "u2", "u3"}))


def test_large_rounds_add_up() -> None:
    first = tuple(f"u{i}" for i in range(10_000))
    second = [f"v{i}" for i in range(5_000)]
    task = given(SurveyTask, CREATED, event(SurveyTaskIssued, round=1, user_ids=first)).when(
        lambda t: t.issue(second)
    ).then(event(SurveyTaskIssued, round=2, user_ids=tuple(second)))
    assert (len(task.issued), task.rounds) == (15_000, 2)


def test_users_already_issued_are_refused_and_nothing_is_issued() -> None:
    error = OPEN_TASK.when(lambda t: t.issue(["u2", "new", "u1"])).then_raises(
        UsersAlreadyIssued, task_id=str(TASK_ID), user_ids=("u1", "u2")
    )
    assert error.details() == {"task_id": str(TASK_ID), "count": 2, "user_ids": ["u1", "u2"]}


@pytest.mark.parametrize(
    ("user_ids", "value"),
    [([], "[]"), (["x", "y", "x"], "1 duplicates"), ([f"u{i}" for i in range(MAX_USERS_PER_ISSUE + 1)],
                                                     f"{MAX_USERS_PER_ISSUE + 1} users")],
)
def test_an_issue_names_some_distinct_users_and_not_too_many(user_ids: list[str], value: str) -> None:
    error = given(SurveyTask, CREATED).when(lambda t: t.issue(user_ids)).then_raises(InvalidValue, field="user_ids")
    assert error.details()["value"] == value


def test_close_is_final() -> None:
    task = OPEN_TASK.when(lambda t: t.close()).then(CLOSED)
    assert task.fsm_states() == {"task": "CLOSED"}
    CLOSED_TASK.when(lambda t: t.close()).then_raises(
        IllegalTransition, aggregate="SurveyTask", current="CLOSED", requested="CLOSED", allowed=()
    )


def test_a_closed_task_is_not_issued() -> None:
    CLOSED_TASK.when(lambda t: t.issue(["late"])).then_raises(TaskClosed, task_id=str(TASK_ID), action="issue")


def assignment_of(user_id: str, *facts):
    return given(SurveyAssignment, *facts, id=assignment_id(TASK_ID, user_id))


def test_an_issued_user_answers() -> None:
    task = OPEN_TASK.aggregate()
    assignment = assignment_of("u1").when(lambda a: a.answer(task, "u1")).then(
        event(SurveyTaskAnswered, task_id=TASK_ID, user_id="u1")
    )
    assert assignment.status is AssignmentStatus.DONE and assignment.fsm_states() == {"answer": "DONE"}


def test_a_blank_assignment_is_pending() -> None:
    assert assignment_of("u1").aggregate().fsm_states() == {"answer": "PENDING"}


def test_a_user_answers_at_most_once() -> None:
    task = OPEN_TASK.aggregate()
    assignment_of("u1", event(SurveyTaskAnswered, task_id=TASK_ID, user_id="u1")).when(
        lambda a: a.answer(task, "u1")
    ).then_raises(IllegalTransition, aggregate="SurveyAssignment", current="DONE", requested="DONE", allowed=())


def test_only_issued_users_answer() -> None:
    task = OPEN_TASK.aggregate()
    assignment_of("stranger").when(lambda a: a.answer(task, "stranger")).then_raises(
        UserNotIssued, task_id=str(TASK_ID), user_id="stranger"
    )


def test_no_answers_after_close() -> None:
    task = CLOSED_TASK.aggregate()
    assignment_of("u1").when(lambda a: a.answer(task, "u1")).then_raises(TaskClosed, task_id=str(TASK_ID), action="answer")


def test_an_assignment_only_takes_its_own_user_and_task() -> None:
    task = OPEN_TASK.aggregate()
    assignment_of("u1").when(lambda a: a.answer(task, "u2")).then_raises(InvalidValue, field="assignment")
    other_task = given(SurveyTask, CREATED, ISSUED).aggregate()
    assignment_of("u1").when(lambda a: a.answer(other_task, "u1")).then_raises(InvalidValue, field="assignment")


def test_a_large_issue_is_recorded_as_parts_of_one_round_each_within_the_budget() -> None:
    users = [f"{i:0128d}" for i in range(MAX_USERS_PER_ISSUE)]
    per_part = ISSUE_EVENT_BUDGET // (128 + 3)
    parts = [tuple(users[i:i + per_part]) for i in range(0, len(users), per_part)]
    task = given(SurveyTask, CREATED).when(lambda t: t.issue(users)).then(*(
        event(SurveyTaskIssued, round=1, user_ids=part, part=n, parts=len(parts)) for n, part in enumerate(parts, 1)))
    assert len(parts) == 50 and (task.rounds, len(task.issued)) == (1, MAX_USERS_PER_ISSUE)


@pytest.mark.parametrize(("user_id", "size"), [("abc", 6), ("é", 5), ('a"b', 11), ("\x01", 9), ("x" * 128, 131)])
def test_the_size_of_a_user_id_in_json_is_bounded_from_above(user_id: str, size: int) -> None:
    import json

    assert json_size(user_id) == size >= len(json.dumps(user_id, ensure_ascii=False).encode()) + 1


def test_a_user_id_larger_than_the_budget_goes_alone() -> None:
    assert list(in_parts(["a", "b" * 20, "c"], budget=10)) == [("a",), ("b" * 20,), ("c",)]
