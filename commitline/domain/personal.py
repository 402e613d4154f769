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
