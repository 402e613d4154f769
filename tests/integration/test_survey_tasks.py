"""Survey tasks at seed-003 scale: 10,000 users in one command, re-issue while users answer."""

from __future__ import annotations

from collections import Counter

import pytest

from commitline.application.errors import IllegalTransition
from commitline.examples.surveys import UserNotIssued, UsersAlreadyIssued
from commitline.examples.surveys import AssignmentStatus, SurveyAssignment, SurveyTask, assignment_id
from commitline.composition import Commitline
from tests.integration.test_concurrency import run_at_once


def test_issue_reissue_and_concurrent_answers(app: Commitline) -> None:
    task_id = app.dispatch({"type": "create_survey_task", "title": "NPS"}, idempotency_key="t").aggregate_id
    first = app.dispatch({"type": "issue_survey_task", "task_id": str(task_id),
                          "user_ids": [f"u{n}" for n in range(10_000)]}, idempotency_key="issue-1")
    assert first.version == 2 and len(first.events[0].payload["user_ids"]) == 10_000

    def answer_or_reissue(i: int) -> object:
        if i == 0:
            return app.dispatch({"type": "issue_survey_task", "task_id": str(task_id),
                                 "user_ids": [f"u{n}" for n in range(10_000, 15_000)]}, idempotency_key="issue-2")
        return app.dispatch({"type": "answer_survey_task", "task_id": str(task_id), "user_id": f"u{i}"},
                            idempotency_key=f"answer-{i}")

    outcomes = run_at_once(40, answer_or_reissue)
    assert Counter(type(o).__name__ for o in outcomes) == {"DispatchResult": 40}

    task = app.store.load(SurveyTask, task_id)
    assert len(task.issued) == 15_000 and task.rounds == 2
    assignment = app.store.load(SurveyAssignment, assignment_id(task_id, "u7"))
    assert assignment.status is AssignmentStatus.DONE and assignment.version == 1
    with pytest.raises(IllegalTransition):
        app.dispatch({"type": "answer_survey_task", "task_id": str(task_id), "user_id": "u7"}, idempotency_key="again")
    with pytest.raises(UserNotIssued):
        app.dispatch({"type": "answer_survey_task", "task_id": str(task_id), "user_id": "stranger"},
                     idempotency_key="stranger")
    with pytest.raises(UsersAlreadyIssued):
        app.dispatch({"type": "issue_survey_task", "task_id": str(task_id), "user_ids": ["u1", "fresh"]},
                     idempotency_key="dup")
