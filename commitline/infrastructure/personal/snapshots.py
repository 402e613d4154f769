"""Snapshots of aggregates whose events have personal fields: sealed whole, under the data key of the subject
the aggregate names, so erasing the subject makes its snapshots unreadable too.

The subject is found on the aggregate by the names its events' personal fields give (``holder``, or a
``customer_id`` the aggregate keeps as the event does); an aggregate naming no single subject, or holding an
erased value, is not snapshotted. A sealed snapshot is stored as ``{"pd": <sealed form>}``; one whose key is
gone opens as None, and the store then replays the stream from its first event.
"""

from __future__ import annotations

import dataclasses

import orjson

from commitline.domain import Aggregate
from commitline.domain.personal import Erased
from commitline.infrastructure.personal.cipher import PersonalData

MARK = b'{"pd":'
FIELD = "snapshot"


def _context(aggregate_id: object, version: int) -> str:
    return f"{aggregate_id} v{version}"


def subject_of(aggregate: Aggregate, subjects: tuple[str, ...]) -> str | None:
    """The one subject ``aggregate`` names by ``subjects``; None for none or several."""
    values = {getattr(aggregate, name, None) for name in subjects}
    if len(values) != 1:
        return None
    (value,) = values
    return None if value is None or value == "" or isinstance(value, Erased) else str(value)


def sealable(aggregate: Aggregate, subjects: tuple[str, ...]) -> bool:
    """Whether ``aggregate`` is to be snapshotted: it names one subject and holds no erased value (checked before
    its state is encoded: an erased value is no value of its field's type)."""
    return subject_of(aggregate, subjects) is not None and not any(
        isinstance(getattr(aggregate, f.name), Erased) for f in dataclasses.fields(aggregate))


def seal(personal: PersonalData, tenant: str, aggregate: Aggregate, subjects: tuple[str, ...],
         state: bytes) -> bytes | None:
    """The stored form of a snapshot's ``state``; None when it is not to be snapshotted."""
    subject = subject_of(aggregate, subjects)
    if subject is None or not sealable(aggregate, subjects):
        return None
    return orjson.dumps({"pd": personal.seal(tenant, subject, _context(aggregate.id, aggregate.version), FIELD,
                                             None, state)})


def open_state(personal: PersonalData | None, tenant: str, aggregate_id: object, version: int,
               state: bytes, *, sealed: bool = False) -> bytes | None:
    """A stored snapshot's state as ``encode_snapshot`` wrote it; None once its subject was erased, and None for
    a plain state where the type's snapshots are ``sealed`` (written by hand, or from before: never trusted)."""
    if not state.startswith(MARK) or personal is None:
        return state if not state.startswith(MARK) and not sealed else None
    opened = personal.open(tenant, _context(aggregate_id, version), FIELD, orjson.loads(state)["pd"])
    return None if isinstance(opened, Erased) else orjson.dumps(opened)
