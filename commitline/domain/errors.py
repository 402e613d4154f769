"""Domain errors: what a pure aggregate raises when a command would break its rules.

Every error carries machine-readable fields (``code`` plus ``details()``) so the
application layer can return it as data without parsing messages. An error class only
declares its ``fields`` (the constructor's arguments, in order) and a ``message``
template over them; the base keeps the arguments, formats the message and lists the
fields in ``details()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar


class _Attributes:
    """An error's attributes (properties included), looked up by name as ``str.format_map`` does."""

    def __init__(self, error: CommitlineError):
        self._error = error

    def __getitem__(self, name: str) -> Any:
        return getattr(self._error, name)


class CommitlineError(Exception):
    """Base of every error commitline raises on purpose; ``code`` and ``details()`` are stable.

    ``fields`` name the constructor arguments, kept as attributes of the same names; a class
    attribute of a field's name is that argument's default. ``message`` is a ``str.format``
    template over the attributes. ``details()`` returns the fields, with those in
    ``text_fields`` as ``str``. A class without ``fields`` takes its message as argument.
    """

    code = "error"
    fields: ClassVar[tuple[str, ...]] = ()
    text_fields: ClassVar[tuple[str, ...]] = ()
    message: ClassVar[str] = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not self.fields:
            super().__init__(*args, **kwargs)
            return
        values = dict(zip(self.fields, args))
        if len(args) > len(self.fields) or values.keys() & kwargs or kwargs.keys() - set(self.fields):
            raise TypeError(f"{type(self).__name__} takes {', '.join(self.fields)}; got {args!r}, {kwargs!r}")
        values.update(kwargs)
        for field in self.fields:
            if field not in values and not hasattr(type(self), field):
                raise TypeError(f"{type(self).__name__} is missing the argument {field!r}")
            setattr(self, field, values.get(field, getattr(type(self), field, None)))
        super().__init__(self.message.format_map(_Attributes(self)))

    def details(self) -> dict[str, Any]:
        return {f: str(getattr(self, f)) if f in self.text_fields else getattr(self, f) for f in self.fields}

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "code": self.code, "message": str(self), "details": self.details()}


class DomainError(CommitlineError):
    """A command was refused by the domain rules; nothing was changed."""

    code = "domain_error"


class IllegalTransition(DomainError):
    """The finite-state machine does not allow moving from ``current`` to ``requested``."""

    code = "illegal_transition"
    fields = ("aggregate", "current", "requested", "allowed")
    message = "{aggregate} cannot move from {current} to {requested}; allowed from {current}: {targets}"

    def __init__(self, aggregate: str, current: str, requested: str, allowed: Iterable[str]):
        super().__init__(aggregate, current, requested, tuple(sorted(allowed)))

    @property
    def targets(self) -> str:
        return ", ".join(self.allowed) or "none (terminal state)"

    def details(self) -> dict[str, Any]:
        return {**super().details(), "allowed": list(self.allowed)}


class InvalidValue(DomainError):
    """A value violates an invariant of the domain (for example a non-positive amount)."""

    code = "invalid_value"
    fields = ("field", "value", "reason")
    text_fields = ("value",)
    message = "{field}={value!r}: {reason}"


class InsufficientStock(DomainError):
    code = "insufficient_stock"
    fields = ("item_id", "requested", "available")
    message = "item {item_id}: requested {requested}, available {available}"


class ReservationError(DomainError):
    """A command named a reservation the item does not have, or already has."""

    fields = ("item_id", "reservation_id")


class UnknownReservation(ReservationError):
    code = "unknown_reservation"
    message = "item {item_id} has no reservation {reservation_id}"


class DuplicateReservation(ReservationError):
    code = "duplicate_reservation"
    message = "item {item_id} already has a reservation {reservation_id}"


class TaskClosed(DomainError):
    code = "task_closed"
    fields = ("task_id", "action")
    message = "task {task_id} is closed: cannot {action}"


class UsersAlreadyIssued(DomainError):
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


class OrderAlreadyConfirmed(DomainError):
    """A customer's cancel of a confirmed order: its payment is captured (or being captured), so cancelling
    it would leave the money taken. Only the fulfilment saga cancels a confirmed order, when its capture failed."""

    code = "order_already_confirmed"
    fields = ("order_id",)
    message = ("order {order_id} is confirmed and its payment captured or being captured: it can no longer be "
               "cancelled (a refund is a new business transaction, not a cancel)")


class UserNotIssued(DomainError):
    code = "user_not_issued"
    fields = ("task_id", "user_id")
    message = "task {task_id} was never issued to user {user_id}"
