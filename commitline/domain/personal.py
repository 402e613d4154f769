"""Personal data in events: ``Personal`` marks an event field as a data subject's, ``Erased`` is what such a
field reads as once that subject was erased.

An event field is declared personal by its annotation, tied to the data subject it belongs to::

    class CustomerRegistered(Event):
        customer_id: str
        email: Annotated[str, Personal(subject="customer_id")]

``subject`` names a field of the event, or an attribute (a field or a property) of the aggregate that
emits it, evaluated once the command's events are applied. Its value identifies the subject within the
tenant; it is kept in plain text (in the key table, the erasure record and wherever the domain stores it),
so it must be an identifier, never a personal value itself. The store encrypts every personal value with
the (tenant, subject)'s data key before anything is written; erasing the subject deletes that key, and from
then on the field reads as ``ERASED`` (an ``Erased``, shown in JSON as ``{"erased": true}``), not an error.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any

from pydantic_core import SchemaSerializer, core_schema

#: How an erased value is written in JSON (history, replayed outcomes, read-model rows)
ERASED_JSON: dict[str, bool] = {"erased": True}


class Erased:
    """The value of a personal field whose subject was erased: one instance, ``ERASED``."""

    __slots__ = ()
    _instance: Erased | None = None

    def __new__(cls) -> Erased:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ERASED"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Erased, ())

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any = None, handler: Any = None) -> core_schema.CoreSchema:
        return core_schema.is_instance_schema(
            cls, serialization=core_schema.plain_serializer_function_ser_schema(lambda _: dict(ERASED_JSON)))


# pydantic serialises values of unknown types it meets (in a ``dict[str, Any]``, say) through this attribute
Erased.__pydantic_serializer__ = SchemaSerializer(Erased.__get_pydantic_core_schema__())  # type: ignore[attr-defined]
ERASED = Erased()


@dataclass(frozen=True)
class Personal:
    """The annotation of a personal event field: ``Annotated[str, Personal(subject="holder_id")]``."""

    subject: str

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        # the field's own type, or ERASED when it is read after its subject was erased
        return core_schema.union_schema([Erased.__get_pydantic_core_schema__(), handler(source)])


@functools.cache
def personal_fields(cls: type) -> tuple[tuple[str, str], ...]:
    """An event class's personal fields as (field, subject) pairs, in declaration order; none for most.
    Raises what resolving the class's annotations raises (``framework.checks`` reports it)."""
    if not dataclasses.is_dataclass(cls):
        return ()
    hints = typing.get_type_hints(cls, include_extras=True)
    found = []
    for f in dataclasses.fields(cls):
        marks = [m for m in getattr(hints.get(f.name), "__metadata__", ()) if isinstance(m, Personal)]
        if marks:
            found.append((f.name, marks[0].subject))
    return tuple(found)


def subject_of(event: Any, aggregate: Any, subject: str) -> Any:
    """The value naming ``event``'s data subject: the event's field ``subject``, else its aggregate's attribute."""
    if subject in getattr(event, "__dataclass_fields__", {}):
        return getattr(event, subject)
    return getattr(aggregate, subject, None)


@functools.cache
def personal_names(aggregate: type) -> frozenset[str]:
    """The names of the personal fields of the events an aggregate class applies (its ``EVENTS``)."""
    return frozenset(name for event in getattr(aggregate, "EVENTS", ()) for name, _ in personal_fields(event))


def personal_values(event: Any) -> dict[str, Any]:
    """An event's plain personal values by field (erased ones left out): what an error about it must not show."""
    return {name: value for name, _ in personal_fields(type(event))
            if (value := getattr(event, name, None)) is not None and not isinstance(value, Erased)}


def _texts(value: Any) -> list[str]:
    """Every text a value may be written as in a message: itself (str and repr), and each item of a container."""
    if isinstance(value, dict):
        return [t for item in value.values() for t in _texts(item)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [t for item in value for t in _texts(item)]
    text = str(value)
    return [text, repr(value)[1:-1]] if isinstance(value, str) else [text]


def withheld(text: str, values: dict[str, Any]) -> str:
    """``text`` with each personal value of ``values`` (field -> plain value) replaced by ``<personal FIELD>``:
    how a message about an event (a poison event's error, a parked saga's reason) is stored and logged."""
    found = sorted(((t, field) for field, value in values.items() for t in _texts(value) if t),
                   key=lambda pair: -len(pair[0]))  # longest first: a value that holds another is replaced whole
    for t, field in found:
        text = text.replace(t, f"<personal {field}>")
    return text


def error_text(error: BaseException, values: dict[str, Any]) -> str:
    """``Type: message`` of an error met while handling an event, with its personal ``values`` withheld. A
    validation error is told by its locations and messages only: pydantic's own text quotes every input."""
    from pydantic_core import ValidationError

    if isinstance(error, ValidationError):
        problems = [f"{'.'.join(map(str, e['loc'])) or '<value>'}: {e['msg']}" for e in error.errors(include_url=False)]
        message = f"{error.error_count()} validation error(s) for {error.title}: {'; '.join(problems)}"
    else:
        message = str(error)
    return withheld(f"{type(error).__name__}: {message}", values)
