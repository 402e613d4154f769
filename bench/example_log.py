"""Endless streams of the examples' events, made by the aggregates' own command methods, so every event is valid
(no projection or load ever meets a poison event); used to pre-fill the logs of ``projection_rebuild`` and
``scale`` (measures nothing itself).

- :func:`survey_events`: ``SurveyTask.create`` + ``issue`` to 50 users, then 45 of them answer
  (``SurveyTaskAnswered`` on their own ``SurveyAssignment`` stream, version 1);
- :func:`payment_events`: in waves of 500: created, submitted, then completed (3 of 4) or failed (1 of 4), the
  failed ones submitted again and completed;
- :func:`inventory_events`: in waves of 200 items: 100 received, then 3 rounds of reserve 5, release or fulfil
  it, receive 10.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from decimal import Decimal
from uuid import uuid4

from commitline.domain import Event
from commitline.examples.inventory import InventoryItem
from commitline.examples.payments import PaymentState, PaymentTransaction
from commitline.examples.surveys import SurveyAssignment, SurveyTask, assignment_id

USERS_PER_TASK, ANSWERS_PER_TASK = 50, 45
PAYMENT_WAVE, INVENTORY_WAVE, INVENTORY_ROUNDS = 500, 200, 3


def survey_events() -> Iterator[Event]:
    users = [f"user-{i}" for i in range(USERS_PER_TASK)]
    while True:
        task = SurveyTask.create(uuid4(), "bench survey")
        task.issue(users)
        yield from task.collect_events()
        for user in users[:ANSWERS_PER_TASK]:
            assignment = SurveyAssignment.blank(assignment_id(task.id, user))
            assignment.answer(task, user)
            yield from assignment.collect_events()


def payment_events() -> Iterator[Event]:
    currencies = ("USD", "EUR", "GBP")
    serial = itertools.count()
    while True:
        payments = []
        for _ in range(PAYMENT_WAVE):
            i = next(serial)
            payments.append(PaymentTransaction.create(
                uuid4(), amount=Decimal(f"{10 + i % 90}.{i % 100:02d}"), currency=currencies[i % 3],
                account=f"acc-{i % 97}"))
        steps = [lambda p: None, lambda p: p.submit()]
        steps.append(lambda p: p.fail("declined") if p.id.int % 4 == 0 else p.complete())
        for step in steps:
            for p in payments:
                step(p)
                yield from p.collect_events()
        failed = [p for p in payments if p.state is PaymentState.FAILED]
        for step in (lambda p: p.submit(), lambda p: p.complete()):
            for p in failed:
                step(p)
                yield from p.collect_events()


def inventory_events() -> Iterator[Event]:
    while True:
        items = [InventoryItem.receive_new(uuid4(), 100) for _ in range(INVENTORY_WAVE)]
        for item in items:
            yield from item.collect_events()
        for r in range(INVENTORY_ROUNDS):
            steps = (lambda it, n: it.reserve(f"r{r}", 5),
                     lambda it, n: it.release(f"r{r}") if n % 2 else it.fulfil(f"r{r}"),
                     lambda it, n: it.receive(10))
            for step in steps:
                for n, item in enumerate(items):
                    step(item, n)
                    yield from item.collect_events()
