"""Domain errors: what a pure aggregate raises when a command would break its rules.

Every error carries machine-readable fields (``code`` plus ``details()``) so the
application layer can return it as data without parsing messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class CommitlineError(Exception):
    """Base of every error commitline raises on purpose; ``code`` and ``details()`` are stable."""

    code = "error"

    def details(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "code": self.code, "message": str(self), "details": self.details()}


class DomainError(CommitlineError):
    """A command was refused by the domain rules; nothing was changed."""

    code = "domain_error"


class IllegalTransition(DomainError):
    """The finite-state machine does not allow moving from ``current`` to ``requested``."""

    code = "illegal_transition"

    def __init__(self, aggregate: str, current: str, requested: str, allowed: Iterable[str]):
        self.aggregate = aggregate
        self.current = current
        self.requested = requested
        self.allowed = tuple(sorted(allowed))
        targets = ", ".join(self.allowed) or "none (terminal state)"
        super().__init__(
            f"{aggregate} cannot move from {current} to {requested}; allowed from {current}: {targets}"
        )

    def details(self) -> dict[str, Any]:
        return {
            "aggregate": self.aggregate,
            "current": self.current,
            "requested": self.requested,
            "allowed": list(self.allowed),
        }


class InvalidValue(DomainError):
    """A value violates an invariant of the domain (for example a non-positive amount)."""

    code = "invalid_value"

    def __init__(self, field: str, value: Any, reason: str):
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")

    def details(self) -> dict[str, Any]:
        return {"field": self.field, "value": str(self.value), "reason": self.reason}


class InsufficientStock(DomainError):
    code = "insufficient_stock"

    def __init__(self, item_id: str, requested: int, available: int):
        self.item_id = item_id
        self.requested = requested
        self.available = available
        super().__init__(f"item {item_id}: requested {requested}, available {available}")

    def details(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "requested": self.requested, "available": self.available}


class UnknownReservation(DomainError):
    code = "unknown_reservation"

    def __init__(self, item_id: str, reservation_id: str):
        self.item_id = item_id
        self.reservation_id = reservation_id
        super().__init__(f"item {item_id} has no reservation {reservation_id}")

    def details(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "reservation_id": self.reservation_id}


class DuplicateReservation(DomainError):
    code = "duplicate_reservation"

    def __init__(self, item_id: str, reservation_id: str):
        self.item_id = item_id
        self.reservation_id = reservation_id
        super().__init__(f"item {item_id} already has a reservation {reservation_id}")

    def details(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "reservation_id": self.reservation_id}


class UsersAlreadyIssued(DomainError):
    """A (re-)issue named users who already hold the task; nothing is issued."""

    code = "users_already_issued"

    def __init__(self, task_id: str, user_ids: Iterable[str]):
        self.task_id = task_id
        self.user_ids = tuple(sorted(user_ids))
        shown = ", ".join(self.user_ids[:10]) + (" ..." if len(self.user_ids) > 10 else "")
        super().__init__(f"task {task_id} was already issued to {len(self.user_ids)} of these users: {shown}")

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "count": len(self.user_ids), "user_ids": list(self.user_ids[:100])}


class UserNotIssued(DomainError):
    code = "user_not_issued"

    def __init__(self, task_id: str, user_id: str):
        self.task_id = task_id
        self.user_id = user_id
        super().__init__(f"task {task_id} was never issued to user {user_id}")

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "user_id": self.user_id}


class TaskClosed(DomainError):
    code = "task_closed"

    def __init__(self, task_id: str, action: str):
        self.task_id = task_id
        self.action = action
        super().__init__(f"task {task_id} is closed: cannot {action}")

    def details(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "action": self.action}
