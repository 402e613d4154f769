"""Applying one batch of notifications to a projection, exactly once.

The handlers run in memory; then the changes and the new position are written in ONE
transaction, so a crash at any point either keeps the whole batch or none of it. A
handler that raises marks a poison event: the events before it are committed, the
position stops just before it, and the error, the event and its position are recorded
for ``commitline status``. So does an event whose rows cannot be written (a value of another type than its
column): found by bisecting the batch with trial writes that are rolled back. The error's text withholds the
event's personal values (``<personal FIELD>`` in their place). Nothing is ever skipped without an operator
saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from eventsourcing.persistence import Notification

from commitline.application.errors import ConfigurationError
from commitline.domain.personal import Erased, error_text, personal_values
from commitline.infrastructure.store.codec import EventCodec, RecordedEvent
from commitline.infrastructure.followers.positions import Positions
from commitline.projections.base import Changes, Projection
from commitline.projections.storage import load_rows, write_changes


@dataclass(frozen=True)
class BatchOutcome:
    position: int
    applied: int
    poison: dict[str, Any] | None = None


def decode_batch(codec: EventCodec, notifications: Sequence[Notification], topics: frozenset[str]) -> list[Any]:
    """Per notification: its ``RecordedEvent`` if its type is one of ``topics`` (or unknown: that is poison
    to every projection), the error that stopped its decoding, or None (not decoded: nobody handles it).
    Rebuilding several projections, the batch is decoded once for all of them (the union of their topics)."""
    known = codec.registry.event_types
    wanted = [n for n in notifications if n.topic in topics or n.topic not in known]
    if not wanted:
        return [None] * len(notifications)
    codec.preload_keys(n.state for n in wanted)  # one key read for the batch, not one per data subject
    decode = codec.decode_event
    out: list[Any] = []
    append = out.append
    for n in notifications:
        topic = n.topic
        if topic in topics or topic not in known:
            try:
                append(decode(topic, n.originator_id, n.originator_version, n.state))
            except Exception as e:  # an undecodable event is poison like a failing handler
                append(e)
        else:
            append(None)  # not this projection's business: only the position moves past it
    return out


def _relevant(projection: Projection, codec: EventCodec, notifications: Sequence[Notification],
              decoded: Sequence[Any] | None) -> tuple[Sequence[Any], list[int]]:
    """What ``decode_batch`` made of ``notifications`` (decoding them now if not done), and the indexes of
    those this projection applies: the events it handles, and any of an unknown type (poison to all). A batch
    decoded for several projections holds the others' events too; they are passed over like undecoded ones."""
    handled = projection.handled_topics()
    if decoded is None:
        decoded = decode_batch(codec, notifications, handled)
    known = codec.registry.event_types
    return decoded, [i for i, n in enumerate(notifications)
                     if decoded[i] is not None and (n.topic in handled or n.topic not in known)]


def _poison(n: Notification, error: Exception, codec: EventCodec, recorded: Any) -> dict[str, Any]:
    """The poison event's record (stored, logged, shown by ``status``): its position, type, stream and the
    error, whose text never holds the event's personal values."""
    values = personal_values(recorded.event) if isinstance(recorded, RecordedEvent) else _opened(codec, n)
    return {"position": n.id, "event_type": n.topic, "aggregate_id": str(n.originator_id),
            "version": n.originator_version, "message": error_text(error, values)}


def _opened(codec: EventCodec, n: Notification) -> dict[str, Any]:
    """The personal values of an event that did not decode (to withhold them from the error), if they open."""
    try:
        stored = orjson.loads(n.state)
        if not stored.get("pd"):
            return {}
        opened = codec.opened(stored)
        return {name: opened[name] for name in stored["pd"] if not isinstance(opened[name], Erased)}
    except Exception:  # the error itself is what gets reported
        return {}


def apply_batch(conn: psycopg.Connection[Any], schema: str, projection: Projection, codec: EventCodec,
                follower: str, start_position: int, notifications: Sequence[Notification],
                suffix: str = "", generation: int | None = None, *, decoded: Sequence[Any] | None = None,
                synchronous: bool = True, through: int | None = None, waits_for_release: bool = False) -> BatchOutcome:
    """Apply ``notifications`` (``decoded``: what ``decode_batch`` made of them, if done already) and save
    the position, in one transaction: the last notification's id, or ``through`` when the log was read up to
    there (events after the last notification that nobody here handles). ``synchronous=False`` (a rebuild's
    ``__next`` tables): the commit does not wait for its WAL flush; a crash may lose the last batches, rows and
    position together (never one without the other), and the rebuild resumes from the position that survived.

    ``waits_for_release`` (the live projector): an event this process cannot decode for want of the right release
    or key (a ``ConfigurationError``: a class version newer than its code, a type it does not declare, a data key
    its master key cannot open) is not poison: the error is raised, nothing of the batch is written, and the
    projector retries it until a process that can read it (the next release, the new key) does."""
    decoded, relevant = _relevant(projection, codec, notifications, decoded)
    changes = projection.new_changes()
    if projection.prefetch:
        specs = projection.table_specs()
        events = [decoded[i] for i in relevant if isinstance(decoded[i], RecordedEvent)]
        for table, keys in projection.keys_to_prefetch(events).items():
            changes.loaded[table] = load_rows(conn, schema, specs[table], keys, suffix)
    position = through if through is not None else notifications[-1].id if notifications else start_position
    applied, poison = 0, None
    apply = projection.apply
    for i in relevant:
        recorded = decoded[i]
        if waits_for_release and isinstance(recorded, ConfigurationError):
            raise recorded
        try:
            if isinstance(recorded, Exception):
                raise recorded
            apply(changes, recorded)
            applied += 1
        except Exception as e:
            poison = _poison(notifications[i], e, codec, recorded)
            # the position stops just before it: the event before it in the batch, or where the batch began
            position = notifications[i - 1].id if i > 0 else start_position
            # The failing handler may have half-recorded its changes: redo the batch up to it.
            changes = _replay_until(projection, changes, decoded, relevant, i)
            break
    # ``applied`` events of ``relevant`` made ``changes`` (a poison event after them stopped the batch)

    def commit(changes: Changes, position: int, poison: dict[str, Any] | None) -> None:
        with conn.transaction():
            if not synchronous:
                conn.execute("SET LOCAL synchronous_commit = off")
            write_changes(conn, schema, changes, suffix)
            Positions(schema).save(conn, follower, position, poison=poison, generation=generation)

    try:
        commit(changes, position, poison)
    except UNWRITABLE:
        # The rows the handlers made cannot be written (a value of another type than its column, say): the event
        # that made them unwritable is poison, as a handler's error is; the events before it are committed.
        found = _first_unwritable(conn, schema, projection, decoded, relevant[:applied], changes.loaded, suffix)
        if found is None:  # the batch's rows write now: the failure was not theirs
            raise
        k, error = found
        i = relevant[k]
        poison = _poison(notifications[i], error, codec, decoded[i])
        position = notifications[i - 1].id if i > 0 else start_position
        commit(_replay_until(projection, changes, decoded, relevant, i), position, poison)
        return BatchOutcome(position, k, poison)
    return BatchOutcome(position, applied, poison)


#: Errors of writing a batch's rows that its rows cause (not the store's outage): the batch holds a poison event.
UNWRITABLE = (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError)


class _RolledBack(Exception):
    """Ends a trial write's transaction (``_first_unwritable``): nothing of it is kept."""


def _first_unwritable(conn: psycopg.Connection[Any], schema: str, projection: Projection, decoded: Sequence[Any],
                      relevant: list[int], loaded: Any, suffix: str) -> tuple[int, Exception] | None:
    """The index (in ``relevant``) of the first event whose changes cannot be written, with the error, found by
    bisection over trial writes that are rolled back: the changes of ``relevant[:lo]`` write, those of
    ``relevant[:hi]`` do not, until ``hi == lo + 1``. None when all of them write."""
    def trial(count: int) -> Exception | None:
        changes = _changes_of(projection, loaded, decoded, relevant[:count])
        try:
            with conn.transaction():
                write_changes(conn, schema, changes, suffix)
                raise _RolledBack
        except _RolledBack:
            return None
        except UNWRITABLE as e:
            return e

    lo, hi = 0, len(relevant)
    error = trial(hi)
    if error is None:
        return None
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if (found := trial(middle)) is None:
            lo = middle
        else:
            hi, error = middle, found
    return lo, error


def _replay_until(projection: Projection, spoiled: Changes, decoded: Sequence[Any], relevant: list[int],
                  stop_at: int) -> Changes:
    """The changes of the batch's events before index ``stop_at`` (every one of them applied cleanly)."""
    return _changes_of(projection, spoiled.loaded, decoded, [i for i in relevant if i < stop_at])


def _changes_of(projection: Projection, loaded: Any, decoded: Sequence[Any], indexes: Sequence[int]) -> Changes:
    """The changes the events at ``indexes`` make, over the rows ``loaded`` before the batch."""
    changes = projection.new_changes()
    changes.loaded = loaded
    for i in indexes:
        projection.apply(changes, decoded[i])
    return changes
