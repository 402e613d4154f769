"""The errors every domain shares: what a pure aggregate raises when a command would break its rules.

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
        """The fields, those in ``text_fields`` as ``str`` (None stays null), and so is a whole number beyond 64 bits
        (JSON encoders refuse it: an error about a huge number must still be answered)."""
        return {f: str(v) if (f in self.text_fields and v is not None) or (type(v) is int and not -2**63 <= v < 2**63)
                else v for f, v in ((f, getattr(self, f)) for f in self.fields)}

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "code": self.code, "message": str(self), "details": self.details()}


class DomainError(CommitlineError):
    """A command was refused by the domain rules; nothing was changed.

    A domain's own errors subclass it with a stable ``code`` and the HTTP ``status`` it maps to
    (409 for a refusal by the aggregate's state, 404 for something it does not have, 422 for a
    value it cannot take), and are registered with their domain (``Domain.error``), which puts them
    in the problem-document table and the OpenAPI description."""

    code = "domain_error"
    status: ClassVar[int | None] = None


class IllegalTransition(DomainError):
    """The finite-state machine does not allow moving from ``current`` to ``requested``."""

    code = "illegal_transition"
    fields = ("aggregate", "current", "requested", "allowed")
    message = "{aggregate} cannot move from {current} to {requested}; allowed from {current}: {targets}"

    def __init__(self, aggregate: str, current: str, requested: str, allowed: Iterable[str]):
        super().__init__(aggregate, current, requested, tuple(sorted(allowed)))

    @property
    def targets(self) -> str:
        if self.current == "NEW" and not self.allowed:  # the first state is set by the first event, not a move
            return "none: a new aggregate's first event is emitted with _emit, whose _evolve sets its first state"
        return ", ".join(self.allowed) or "none (terminal state)"

    def details(self) -> dict[str, Any]:
        return {**super().details(), "allowed": list(self.allowed)}


class InvalidValue(DomainError):
    """A value violates an invariant of the domain (for example a non-positive amount)."""

    code = "invalid_value"
    fields = ("field", "value", "reason")
    text_fields = ("value",)
    message = "{field}={shown}: {reason}"

    @property
    def shown(self) -> str:
        """Text quoted, any other value (a number, a Decimal, an id) as it is written: ``amount=1.001``."""
        return repr(self.value) if isinstance(self.value, str) else str(self.value)


class InvalidPersonalValue(InvalidValue):
    """An ``InvalidValue`` of a personal field: the message and ``details()`` name the field and the reason, never
    the value (``value`` is None), so neither an answer, a log line nor a trace repeats a data subject's value.
    The processor raises it in place of an ``InvalidValue`` naming a personal field of the aggregate's events."""

    message = "{field}: {reason} (a personal value: not shown)"

    def __init__(self, field: str, reason: str):
        super().__init__(field, None, reason)

    def details(self) -> dict[str, Any]:
        return {"field": self.field, "value": None, "reason": self.reason}
