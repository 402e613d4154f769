"""A handler that reads another aggregate (its ``load`` parameter) is specified without a database: ``loader``
serves given aggregates, rebuilt afresh at each load, and anything else is ``AggregateNotFound``."""

from __future__ import annotations

from uuid import uuid4

import pytest

from commitline.application.errors import AggregateNotFound
from commitline.examples.surveys import (AnswerSurveyTask, SurveyAssignment, SurveyTask, SurveyTaskAnswered,
                                         SurveyTaskCreated, SurveyTaskIssued, UserNotIssued, answer_survey_task,
                                         assignment_id)
from commitline.testing import event, given, loader

TASK = uuid4()
ISSUED = given(SurveyTask, event(SurveyTaskCreated, title="t"), event(SurveyTaskIssued, round=1, user_ids=("ann",)),
               id=TASK)


def answering(user: str) -> given[SurveyAssignment]:
    return given(SurveyAssignment, id=assignment_id(TASK, user))


def test_a_handler_reads_the_given_aggregate_through_the_loader() -> None:
    answer = AnswerSurveyTask(task_id=TASK, user_id="ann")
    answering("ann").when(lambda a: answer_survey_task(a, answer, loader(ISSUED))).then(
        event(SurveyTaskAnswered, task_id=TASK, user_id="ann"))
    answer = AnswerSurveyTask(task_id=TASK, user_id="bob")
    answering("bob").when(lambda a: answer_survey_task(a, answer, loader(ISSUED))).then_raises(
        UserNotIssued, user_id="bob")


def test_an_aggregate_not_given_or_of_another_class_is_not_found() -> None:
    load = loader(ISSUED, given(SurveyTask, id=(empty := uuid4())))
    assert load(SurveyTask, TASK).issued == frozenset({"ann"})
    assert load(SurveyTask, TASK) is not load(SurveyTask, TASK)  # afresh: a handler's changes stay its own
    for cls, missing in ((SurveyTask, uuid4()), (SurveyAssignment, TASK), (SurveyTask, empty)):
        with pytest.raises(AggregateNotFound) as refused:
            load(cls, missing)
        assert refused.value.aggregate_type == cls.__name__ and refused.value.aggregate_id == missing
