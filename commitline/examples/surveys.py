"""Surveys (seed 003): a task issued to batches of users, re-issued later, each user answering at most once.

Answers are recorded on a per-(task, user) ``SurveyAssignment`` stream rather than on
the task's own stream, so thousands of users answering at once never contend for one
stream version, and a re-issue never blocks an answer. The task stream holds who was
issued; the assignment stream holds that user's answer. Task-status counters are
built from both by a projection, never updated on the command path.

A large issue (up to 100,000 users) is recorded as several ``SurveyTaskIssued`` events of
one round (``part`` of ``parts``), each holding at most ``ISSUE_EVENT_BUDGET`` bytes of user
ids, all appended atomically by the one command: every stored event, and every Kafka record
made from it, stays well below Kafka's default 1 MB message limit.

The whole slice: both aggregates with their events and tables, the errors, the commands and their
handlers, and the ``task_statuses`` read model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from enum import Enum
from typing import Annotated, Any
from uuid import UUID, uuid5

from pydantic import Field

from commitline import (Aggregate, AggregateNotFound, Changes, Command, Domain, DomainError, Event, Id, InvalidValue,
                        Loader, NonBlankText, Projection, RecordedEvent, Stream, Table, VersionedCommand, on, table)
from commitline.examples.reads import ExampleReads, TaskStatusesOut

domain = Domain("surveys")

MAX_USERS_PER_ISSUE = 100_000
ISSUE_EVENT_BUDGET = 256 * 1024
"""largest size of one ``SurveyTaskIssued`` event's user ids, as JSON bytes"""
_ESCAPED_IN_JSON = re.compile(r'[\x00-\x1f"\\]')
_ASSIGNMENT_NAMESPACE = UUID("6f1c3a52-9d7e-4c39-8a0e-2b5d1e7c9f40")


class TaskState(str, Enum):
    OPEN = "OPEN"
    CLOSED = "CLOSED"


class AssignmentStatus(str, Enum):
    PENDING = "PENDING"
    DONE = "DONE"


TASK_TRANSITIONS = table("SurveyTask", {TaskState.OPEN: {TaskState.CLOSED}, TaskState.CLOSED: set()})
ASSIGNMENT_TRANSITIONS = table(
    "SurveyAssignment", {AssignmentStatus.PENDING: {AssignmentStatus.DONE}, AssignmentStatus.DONE: set()}
)


class SurveyTaskCreated(Event):
    title: str


class SurveyTaskIssued(Event):
    round: int
    user_ids: tuple[str, ...]
    part: int = 1  # this event's share of the round's users ...
    parts: int = 1  # ... of this many events, appended together


class SurveyTaskClosed(Event):
    pass


class SurveyTaskAnswered(Event):
    task_id: UUID
    user_id: str


class TaskRefusal(DomainError):
    """A command the survey task refuses in its present state (409); nothing was changed."""

    status = 409


@domain.error
class TaskClosed(TaskRefusal):
    """The task is closed: it can no longer be issued to users or answered."""

    code = "task_closed"
    fields = ("task_id", "action")
    message = "task {task_id} is closed: cannot {action}"


@domain.error
class UsersAlreadyIssued(TaskRefusal):
    """A (re-)issue named users who already hold the task; nothing is issued."""

    code = "users_already_issued"
    fields = ("task_id", "user_ids")
    message = "task {task_id} was already issued to {count} of these users: {shown}"

    def __init__(self, task_id: str, user_ids: Iterable[str]):
        super().__init__(task_id, tuple(sorted(user_ids)))

    @property
    def count(self) -> int:
        return len(self.user_ids)

    @property
    def shown(self) -> str:
        return ", ".join(self.user_ids[:10]) + (" ..." if self.count > 10 else "")

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "count": self.count, "user_ids": list(self.user_ids[:100])}


@domain.error
class UserNotIssued(TaskRefusal):
    """The user was never issued the task."""

    code = "user_not_issued"
    fields = ("task_id", "user_id")
    message = "task {task_id} was never issued to user {user_id}"


def json_size(user_id: str) -> int:
    """An upper bound of the id's size in a JSON list: UTF-8 bytes, quotes, comma, escapes."""
    size = len(user_id.encode("utf-8", "surrogatepass")) + 3
    if _ESCAPED_IN_JSON.search(user_id):
        size += 5 * len(_ESCAPED_IN_JSON.findall(user_id))
    return size


def in_parts(user_ids: Sequence[str], budget: int = ISSUE_EVENT_BUDGET) -> Iterator[tuple[str, ...]]:
    """The ids in order, cut into runs of at most ``budget`` JSON bytes (a longer id goes alone)."""
    part: list[str] = []
    size = 0
    for user_id in user_ids:
        cost = json_size(user_id)
        if part and size + cost > budget:
            yield tuple(part)
            part, size = [], 0
        part.append(user_id)
        size += cost
    if part:
        yield tuple(part)


def assignment_id(task_id: UUID, user_id: str) -> UUID:
    return uuid5(_ASSIGNMENT_NAMESPACE, f"{task_id}/{user_id}")


@domain.aggregate
class SurveyTask(Aggregate):
    state: TaskState | None = None
    title: str = ""
    rounds: int = 0
    issued: frozenset[str] = frozenset()

    EVENTS = (SurveyTaskCreated, SurveyTaskIssued, SurveyTaskClosed)
    TRANSITIONS = TASK_TRANSITIONS
    MACHINE = ("task", "state")

    @classmethod
    def create(cls, task_id: UUID, title: str) -> SurveyTask:
        if not title.strip():
            raise InvalidValue("title", title, "must not be blank")
        task = cls.blank(task_id)
        task._emit(SurveyTaskCreated, title=title)
        return task

    def issue(self, user_ids: list[str] | tuple[str, ...]) -> None:
        if self.state is TaskState.CLOSED:
            raise TaskClosed(str(self.id), "issue")
        if not user_ids:
            raise InvalidValue("user_ids", user_ids, "must name at least one user")
        if len(user_ids) > MAX_USERS_PER_ISSUE:
            raise InvalidValue("user_ids", f"{len(user_ids)} users", f"at most {MAX_USERS_PER_ISSUE} per issue")
        unique = set(user_ids)
        if len(unique) != len(user_ids):
            raise InvalidValue("user_ids", f"{len(user_ids) - len(unique)} duplicates", "must not repeat a user")
        already = unique & self.issued
        if already:
            raise UsersAlreadyIssued(str(self.id), already)
        round_ = self.rounds + 1
        parts = list(in_parts(user_ids))
        for number, part in enumerate(parts, start=1):
            self._emit(SurveyTaskIssued, round=round_, user_ids=part, part=number, parts=len(parts))

    def close(self) -> None:
        self._move(TaskState.CLOSED, SurveyTaskClosed)

    def _evolve(self, event: Event) -> None:
        match event:
            case SurveyTaskCreated(title=title):
                self.state, self.title = TaskState.OPEN, title
            case SurveyTaskIssued(round=round_, user_ids=user_ids):
                self.rounds, self.issued = round_, self.issued | frozenset(user_ids)
            case SurveyTaskClosed():
                self.state = TaskState.CLOSED


@domain.aggregate
class SurveyAssignment(Aggregate):
    """One user's assignment to one task; its id is derived from both (``assignment_id``)."""

    status: AssignmentStatus = AssignmentStatus.PENDING
    task_id: UUID | None = None
    user_id: str = ""

    EVENTS = (SurveyTaskAnswered,)
    TRANSITIONS = ASSIGNMENT_TRANSITIONS
    MACHINE = ("answer", "status")

    def answer(self, task: SurveyTask, user_id: str) -> None:
        if self.id != assignment_id(task.id, user_id):
            raise InvalidValue("assignment", str(self.id), "does not belong to this task and user")
        if task.state is TaskState.CLOSED:
            raise TaskClosed(str(task.id), "answer")
        if user_id not in task.issued:
            raise UserNotIssued(str(task.id), user_id)
        self._move(AssignmentStatus.DONE, SurveyTaskAnswered, task_id=task.id, user_id=user_id)

    def _evolve(self, event: Event) -> None:
        match event:
            case SurveyTaskAnswered(task_id=task_id, user_id=user_id):
                self.status, self.task_id, self.user_id = AssignmentStatus.DONE, task_id, user_id


UserId = Annotated[str, Field(min_length=1, max_length=128)]


class CreateSurveyTask(Command):
    task_id: Id | None = None
    title: NonBlankText


class IssueSurveyTask(VersionedCommand):
    task_id: Id
    user_ids: Annotated[tuple[UserId, ...], Field(min_length=1, max_length=MAX_USERS_PER_ISSUE)]


class AnswerSurveyTask(Command):
    task_id: Id
    user_id: UserId


class CloseSurveyTask(VersionedCommand):
    task_id: Id


def _assignment(cmd: AnswerSurveyTask) -> UUID:
    return assignment_id(cmd.task_id, cmd.user_id)


@domain.handles(CreateSurveyTask, SurveyTask, Stream.NEW, id="task_id")
def create_survey_task(task: SurveyTask, cmd: CreateSurveyTask) -> SurveyTask:
    return SurveyTask.create(task.id, cmd.title)


domain.handles(IssueSurveyTask, SurveyTask, id="task_id")(lambda task, cmd: task.issue(cmd.user_ids))
domain.handles(CloseSurveyTask, SurveyTask, id="task_id")(lambda task, cmd: task.close())


@domain.handles(AnswerSurveyTask, SurveyAssignment, Stream.ANY, id=_assignment)
def answer_survey_task(assignment: SurveyAssignment, cmd: AnswerSurveyTask, load: Loader) -> None:
    task = load(SurveyTask, cmd.task_id)
    assert isinstance(task, SurveyTask)
    assignment.answer(task, cmd.user_id)


# -- the read model: users per (survey task, status) ------------------------------------------------------

PENDING, DONE = AssignmentStatus.PENDING.value, AssignmentStatus.DONE.value


@domain.read_model
class TaskStatuses(Projection):
    """Users per (survey task, status). Issue adds PENDING users; an answer moves one to DONE."""

    name = "task_statuses"
    tables = (
        Table("rm_task_statuses", {"task_id": "uuid", "status": "text", "tenant": "text", "users": "bigint"},
              key=("task_id", "status"), counters=("users",)),
    )

    @on(SurveyTaskCreated)
    def created(self, changes: Changes, r: RecordedEvent) -> None:
        for status in AssignmentStatus:
            changes.add("rm_task_statuses", (r.event.aggregate_id, status.value), users=0)
            changes.put("rm_task_statuses", (r.event.aggregate_id, status.value), tenant=r.tenant)

    @on(SurveyTaskIssued)
    def issued(self, changes: Changes, r: RecordedEvent) -> None:
        changes.add("rm_task_statuses", (r.event.aggregate_id, PENDING), users=len(r.event.user_ids))

    @on(SurveyTaskAnswered)
    def answered(self, changes: Changes, r: RecordedEvent) -> None:
        changes.add("rm_task_statuses", (r.event.task_id, PENDING), users=-1)
        changes.add("rm_task_statuses", (r.event.task_id, DONE), users=1)


@domain.query("task-statuses/{task_id}", response=TaskStatusesOut, summary="Users per status of one survey task")
def task_statuses(reads: ExampleReads, tenant: str, task_id: UUID) -> dict[str, object]:
    statuses = reads.task_counts(task_id, tenant=tenant)
    if not statuses:
        raise AggregateNotFound("SurveyTask", task_id)
    return {"task_id": task_id, "statuses": dict(sorted(statuses.items()))}
