"""Applying one batch of notifications to a projection, exactly once.

The handlers run in memory; then the changes and the new position are written in ONE
transaction, so a crash at any point either keeps the whole batch or none of it. A
handler that raises marks a poison event: the events before it are committed, the
position stops just before it, and the error, the event and its position are recorded
for ``commitline status``; the error's text withholds the event's personal values
(``<personal FIELD>`` in their place). Nothing is ever skipped without an operator saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from eventsourcing.persistence import Notification

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


def _decoded(projection: Projection, codec: EventCodec,
             notifications: Sequence[Notification]) -> list[tuple[Notification, Any]]:
    handled = {cls.type_name() for cls in projection._handlers}
    known = codec.registry.event_types
    wanted = [n for n in notifications if n.topic in handled or n.topic not in known]
    codec.preload_keys(n.state for n in wanted)  # one key read for the batch, not one per data subject
    out: list[tuple[Notification, Any]] = []
    for n in notifications:
        if n.topic in handled or n.topic not in known:
            try:
                out.append((n, codec.decode_event(n.topic, n.originator_id, n.originator_version, n.state)))
            except Exception as e:  # an undecodable event is poison like a failing handler
                out.append((n, e))
        else:
            out.append((n, None))  # not this projection's business: only the position moves past it
    return out


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
                suffix: str = "", generation: int | None = None) -> BatchOutcome:
    decoded = _decoded(projection, codec, notifications)
    relevant = [r for _, r in decoded if isinstance(r, RecordedEvent)]
    changes = projection.new_changes()
    specs = projection.table_specs()
    for table, keys in projection.keys_to_prefetch(relevant).items():
        changes.loaded[table] = load_rows(conn, schema, specs[table], keys, suffix)
    position, applied, poison = start_position, 0, None
    for n, recorded in decoded:
        try:
            if isinstance(recorded, Exception):
                raise recorded
            if recorded is not None:
                projection.apply(changes, recorded)
                applied += 1
        except Exception as e:
            poison = _poison(n, e, codec, recorded)
            break
        position = n.id
    if poison is not None:
        # The failing handler may have half-recorded its changes: redo the batch up to it.
        changes = _replay_until(projection, changes, decoded, poison["position"])
    with conn.transaction():
        write_changes(conn, schema, changes, suffix)
        Positions(schema).save(conn, follower, position, poison=poison, generation=generation)
    return BatchOutcome(position, applied, poison)


def _replay_until(projection: Projection, spoiled: Changes, decoded: list[tuple[Notification, Any]],
                  stop_at: int) -> Changes:
    changes = projection.new_changes()
    changes.loaded = spoiled.loaded
    for n, recorded in decoded:
        if n.id >= stop_at:
            break
        if isinstance(recorded, RecordedEvent):
            projection.apply(changes, recorded)
    return changes
