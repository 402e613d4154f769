"""Operator decisions about a follower (a projection, the publisher) stopped at a poison event: skip it or
retry it; and about any follower after the store went back (``went_back.py``): reset it.

All are explicit: a skip must name the exact position the projection stopped at, a reset names its choice
(the head, a position, or the position kept), and every decision is logged and kept in
``follower_interventions`` with the error it answered.
"""

from __future__ import annotations

import logging
from typing import Any

from eventsourcing.postgres import PostgresDatastore
from psycopg.rows import tuple_row

from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.followers.status import lease_holders
from commitline.infrastructure.followers.went_back import is_went_back, what_to_do
from commitline.infrastructure.store.generations import current_and_head
from commitline.infrastructure.store.schema import EVENTS_TABLE

log = logging.getLogger(__name__)


class InterventionRefused(RuntimeError):
    pass


def _stopped_at(positions: Positions, conn: Any, name: str) -> dict[str, Any]:
    _, status, error = positions.read(conn, name, for_update=True)
    if status != "failed" or not error:
        raise InterventionRefused(f"{name} is not stopped at a poison event (status: {status})")
    if is_went_back(error):
        raise InterventionRefused(f"{name} stopped because the store went back, not at a poison event: "
                                  f"{what_to_do(name)}")
    return error


def skip(datastore: PostgresDatastore, name: str, position: int, reason: str = "") -> str:
    positions = Positions(datastore.schema)
    with datastore.get_connection() as conn, conn.transaction():
        error = _stopped_at(positions, conn, name)
        if error["position"] != position:
            raise InterventionRefused(
                f"{name} stopped at position {error['position']}, not {position}: refusing to skip anything else")
        positions.save(conn, name, position)
        positions.record_intervention(conn, name, "skip", position, {"error": error, "reason": reason})
    log.warning("%s: operator skipped poison event at position %d (%s): %s", name, position,
                error["event_type"], reason or "no reason given")
    return f"{name}: skipped the {error['event_type']} event at position {position}; it continues after it"


def retry(datastore: PostgresDatastore, name: str) -> str:
    positions = Positions(datastore.schema)
    with datastore.get_connection() as conn, conn.transaction():
        error = _stopped_at(positions, conn, name)
        positions.set_status(conn, name, "running")
        positions.record_intervention(conn, name, "retry", error["position"], {"error": error})
    log.warning("%s: operator asked to retry the event at position %d", name, error["position"])
    return f"{name}: will retry the event at position {error['position']}"


RESET_CHOICES = ("from-head", "from", "keep")


def last_drawn_id(conn: Any, schema: str) -> int:
    """The last notification id the events table's identity has handed out (committed or rolled back)."""
    row = conn.cursor(row_factory=tuple_row).execute(
        "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence(%s, 'notification_id')::regclass), 0)",
        (f'"{schema}"."{EVENTS_TABLE}"',)).fetchone()
    return int(row[0]) if row else 0


def reset(datastore: PostgresDatastore, name: str, choice: str, position: int | None = None, reason: str = "") -> str:
    """Set the follower ``name`` (with every bucket of it, for the publisher group) to the log head
    (``from-head``), to ``position`` (``from``) or where it is (``keep``), in the store's current generation,
    no longer stopped, and record the decision. A follower that never ran (no row: a new generation does not
    stop it) gets its row, at the first event for ``keep``. InterventionRefused, nothing written, for a choice
    that is not one of those, a position outside the log (given, or kept by ``keep``), or a follower a live
    instance runs that is not stopped (stop it first: it would overwrite the reset)."""
    if choice not in RESET_CHOICES:
        raise InterventionRefused(f"{name}: choose how to reset it: --from-head, --from N or --keep")
    if (choice == "from") != (position is not None):
        raise InterventionRefused(f"{name}: --from needs a position N, and only --from takes one")
    positions = Positions(datastore.schema)
    with datastore.get_connection() as conn, conn.transaction():
        generation, head = current_and_head(conn, datastore.schema)
        if position is not None and not 0 <= position <= head:
            raise InterventionRefused(f"{name}: position {position} is outside the store's log (0 to its head {head})")
        rows = positions.group_rows(conn, name)
        never_ran = not rows
        if never_ran:  # its row is made here, at the first event, so it starts where the operator decides
            positions.place(conn, name, 0, generation)
            rows = positions.group_rows(conn, name)
        # past the head is fine up to the last id drawn: a follower proves the ids of rolled-back appends too
        beyond = [(n, was) for n, was, *_ in rows if was > head] if choice == "keep" else []
        if beyond:
            drawn = last_drawn_id(conn, datastore.schema)
            beyond = [(n, was) for n, was in beyond if was > drawn]
        if beyond:  # kept there, it would pass over every event written up to it: the store went back
            shown = ", ".join(f"{n} at {was}" for n, was in beyond)
            raise InterventionRefused(f"{name}: {shown}, beyond the store's log (its head {head}): kept there, it "
                                      "would pass over the events written up to that position; reset it --from a "
                                      "position within the log (or --from-head), or rebuild a read model "
                                      "(`commitline projections rebuild NAME`)")
        held = lease_holders(conn, datastore.schema, [n for n, *_ in rows])
        # A group's own row is held by every member: its buckets tell whether an instance works on them.
        worked = [r for r in rows if r[0] != name] or rows
        running = [n for n, _, status, _, _ in worked if n in held and status != "failed"]
        if running:
            what = "it runs" if running == [name] else f"{', '.join(running)} run"
            raise InterventionRefused(f"{name}: {what} in a live instance and {'is' if running == [name] else 'are'} "
                                      "not stopped: stop it first (a reset would be overwritten by what it saves)")
        for row_name, was, status, error, saved in rows:
            to = head if choice == "from-head" else position if choice == "from" else was
            positions.reset(conn, row_name, to, "running" if row_name in held else "stopped", generation)
            positions.record_intervention(conn, row_name, "reset", to, {
                "choice": choice, "was": was, "status": "never run" if never_ran else status,
                "saved_generation": None if never_ran else saved, "generation": generation,
                "head": head, "error": error, "reason": reason})
    moved = ("to start from the first event" if never_ran else "kept at its position") if choice == "keep" \
        else f"set to position {head if choice == 'from-head' else position}"
    buckets = f" (and its {len(rows) - 1} bucket rows)" if len(rows) > 1 else ""
    log.warning("%s%s: operator reset (%s): %s, store generation %d: %s", name, buckets, choice, moved, generation,
                reason or "no reason given")
    return f"{name}{buckets}: {moved} in store generation {generation} (log head {head}); it goes on from there"

