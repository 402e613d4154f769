"""Public test helpers: given/when/then specifications of a domain's aggregates, pure (no I/O)::

    from commitline.testing import event, given

    given(PaymentTransaction, CREATED).when(lambda p: p.submit()).then(event(PaymentSubmitted, attempt=1))
    given(PaymentTransaction, CREATED).when(lambda p: p.complete()).then_raises(IllegalTransition, current="CREATED")

A handler that reads other aggregates (its third parameter, ``load``) is specified the same way, its
``load`` serving given aggregates (``loader``)::

    account = given(Account, event(AccountOpened, cash=Decimal("100")), id=ACCOUNT)
    given(Order).when(lambda o: place_order(o, PlaceOrder(...), loader(account))).then_raises(InsufficientCash)

``given`` replays past events (written as ``event(Type, **payload)``, without ids or times)
into the aggregate; ``when`` runs a command on it (a command that creates an aggregate,
such as ``PaymentTransaction.create``, returns it and is followed instead); ``then`` compares
the emitted events by type and payload, and ``then_raises`` checks the refusal's fields and
that the aggregate did not change. Both return what they checked for further assertions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID, uuid4

from commitline.application.errors import AggregateNotFound
from commitline.domain.aggregate import Aggregate, Event, utcnow
from commitline.domain.decimals import number_fields, refuse_inexact
from commitline.domain.errors import CommitlineError

__all__ = ["Fact", "When", "event", "given", "loader", "recorded"]

A = TypeVar("A", bound=Aggregate)
E = TypeVar("E", bound=CommitlineError)


@dataclass(frozen=True)
class Fact:
    """An event as a specification states it: its type and payload, no envelope."""

    type: type[Event]
    payload: dict[str, Any]

    def __repr__(self) -> str:
        return f"{self.type.__name__}({', '.join(f'{k}={v!r}' for k, v in self.payload.items())})"


def event(event_type: type[Event], **payload: Any) -> Fact:
    """The payload as stated; fields the statement leaves out take their declared defaults. As an emission
    would, it refuses (``TypeError``) a field the event does not declare, one it declares without a default
    and the statement leaves out, and a binary float for a ``Decimal`` field: a store never holds such an
    event, so a specification stating one could pass against a state production cannot reach."""
    fields = {f.name: f for f in dataclasses.fields(event_type) if f.name not in Event.ENVELOPE}
    if unknown := [name for name in payload if name not in fields]:
        raise TypeError(f"{event_type.__qualname__} declares no field {', '.join(map(repr, unknown))} "
                        f"(its fields: {', '.join(fields) or 'none'})")
    defaults = {name: f.default for name, f in fields.items() if f.default is not dataclasses.MISSING}
    defaults.update({name: f.default_factory() for name, f in fields.items()
                     if f.default_factory is not dataclasses.MISSING})
    if missing := [name for name in fields if name not in payload and name not in defaults]:
        raise TypeError(f"event({event_type.__qualname__}, ...) leaves out {', '.join(map(repr, missing))}, "
                        f"which has no default")
    if numbers := number_fields(event_type, event_type.ENVELOPE):
        refuse_inexact(event_type, payload, numbers)
    return Fact(event_type, {**defaults, **payload})


def recorded(aggregate_id: UUID, facts: tuple[Fact, ...], after: int = 0) -> list[Event]:
    """The facts as the events a store would hold: this aggregate's id, versions after ``after``."""
    return [
        f.type(event_id=uuid4(), aggregate_id=aggregate_id, version=after + n, occurred_at=utcnow(), **f.payload)
        for n, f in enumerate(facts, start=1)
    ]


class given(Generic[A]):  # noqa: N801 (a spec reads as a sentence)
    def __init__(self, cls: type[A], *facts: Fact, id: UUID | None = None) -> None:  # noqa: A002
        self.cls, self.facts, self.id = cls, facts, id or uuid4()

    def aggregate(self) -> A:
        """The aggregate rebuilt from the given events, as a repository would load it."""
        return self.cls.replay(self.id, recorded(self.id, self.facts))

    def when(self, command: Callable[[A], object]) -> When[A]:
        return When(self, command)


def loader(*aggregates: given[Any]) -> Callable[[type[Aggregate], UUID], Aggregate]:
    """A handler's ``load(Cls, id)`` serving these given aggregates, each rebuilt afresh at every load as the
    store would load it; any other class or id raises ``AggregateNotFound``, as for an id the tenant lacks."""
    by_id = {spec.id: spec for spec in aggregates}

    def load(cls: type[Aggregate], aggregate_id: UUID) -> Aggregate:
        spec = by_id.get(aggregate_id)
        if spec is None or spec.cls is not cls or not spec.facts:
            raise AggregateNotFound(cls.__name__, aggregate_id)
        return spec.aggregate()

    return load


@dataclass(frozen=True)
class When(Generic[A]):
    given: given[A]
    command: Callable[[A], object]

    def then(self, *expected: Fact) -> Any:  # the aggregate after the command
        """Run the command; it must emit exactly ``expected``. Returns the aggregate after it."""
        aggregate = self.given.aggregate()
        try:
            returned = self.command(aggregate)
        except CommitlineError as e:
            raise AssertionError(f"expected {list(expected)}, but the command was refused: {e!r}") from None
        subject = returned if isinstance(returned, Aggregate) else aggregate
        emitted = subject.collect_events()
        facts = [Fact(type(e), e.payload()) for e in emitted]
        if facts != list(expected):
            raise AssertionError(f"the command emitted {facts}, expected {list(expected)}")
        history = recorded(subject.id, self.given.facts) if subject is aggregate else []
        replayed = type(subject).replay(subject.id, history + emitted)
        if replayed != subject:
            raise AssertionError(f"replaying must rebuild the same state: the command left {subject!r}, its events "
                                 f"replayed give {replayed!r} (does a command change state outside _evolve?)")
        return subject

    def then_raises(self, error_type: type[E], **fields: Any) -> E:
        """Run the command; it must raise ``error_type`` with these field values and change nothing."""
        aggregate = self.given.aggregate()
        try:
            self.command(aggregate)
        except error_type as e:
            caught = e
        else:
            raise AssertionError(f"expected {error_type.__name__}, but the command was accepted")
        found = {name: getattr(caught, name, None) for name in fields}
        if found != fields:
            raise AssertionError(f"{error_type.__name__} was raised with {found}, expected {fields}: {caught}")
        if aggregate != self.given.aggregate():
            raise AssertionError(f"a refused command must not change the aggregate: it left {aggregate!r}")
        if emitted := aggregate.collect_events():
            raise AssertionError(f"a refused command must not emit events: it emitted {emitted}")
        return caught
