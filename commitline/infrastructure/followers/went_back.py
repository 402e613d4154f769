"""Whether a follower may take a slot: the store must not have gone back behind it.

Notification ids are positions in one history (``store/generations.py``). When a follower takes a slot (its
lease's row, or a publisher bucket's), it compares the row with the store: a row saved in another generation
than the current one (the operator started a new one after a restore or an asynchronous failover), or a
position beyond the log head (the store lost events the follower had handled), means the ids ahead may be
used again by other events. The slot then stops, status ``failed`` with a ``store_went_back`` error saying
what happened and what to do (``commitline followers reset NAME --from-head | --from N | --keep``), logged
once; the engine never reads past it until an operator's reset (``interventions.reset``) writes the current
generation back. The publisher also compares what the broker holds (``kafka/broker_check.py``) and stops with
the same error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from commitline.infrastructure.followers.buckets import parse_bucket_name
from commitline.infrastructure.followers.positions import Connection, Positions

log = logging.getLogger(__name__)
KIND = "store_went_back"


def follower_of(name: str) -> str:
    """The follower an operator resets for the row ``name``: a bucket's group, else the follower itself."""
    bucket = parse_bucket_name(name)
    return bucket.group if bucket else name


def what_to_do(name: str, new_generation: bool = False) -> str:
    reset = f"commitline followers reset {follower_of(name)} --from-head | --from N | --keep"
    if new_generation:
        return f"commitline store new-generation --reason TEXT, then {reset}"
    return reset


def went_back(name: str, reason: str, *, position: int, head: int, saved_generation: int, generation: int,
              new_generation: bool = False, **more: Any) -> dict[str, Any]:
    """The error a slot stops with; ``new_generation`` when the operator has yet to start one (the broker's
    evidence, found before anyone did)."""
    todo = what_to_do(name, new_generation)
    return {"kind": KIND, "reason": reason, "position": position, "head": head, "saved_generation": saved_generation,
            "generation": generation, **more, "what_to_do": todo,
            "message": f"the store went back: {reason}; an operator decides: {todo}"}


def is_went_back(error: Mapping[str, Any] | None) -> bool:
    return bool(error) and error.get("kind") == KIND  # type: ignore[union-attr]


def check_rows(conn: Connection, positions: Positions, names: Iterable[str], generation: int,
               head: int) -> dict[str, tuple[int, str]]:
    """(position, status) of each named row (a row not there yet: (0, 'never run')), after stopping those that
    the store went back behind (logged once: a row already stopped so stays as it is)."""
    names = list(names)
    rows = positions.read_slots(conn, names)
    stops: dict[str, dict[str, Any]] = {}
    for name, (position, status, saved) in rows.items():
        if status == "failed":
            continue
        if saved != generation:
            reason = (f"its position {position} was saved in store generation {saved}, and the store is in "
                      f"generation {generation} now (a restore or an asynchronous failover happened since)")
        elif position > head:
            reason = (f"its position {position} is beyond the store's log head {head}: the store lost events it "
                      "had handled (a restore or an asynchronous failover)")
        else:
            continue
        stops[name] = went_back(name, reason, position=position, head=head, saved_generation=saved,
                                generation=generation)
    if stops:
        positions.mark_many(conn, "failed", stops)
        for name, error in stops.items():
            log.critical("%s stopped: %s", name, error["message"])
    return {n: (rows[n][0], "failed" if n in stops else rows[n][1]) if n in rows else (0, "never run") for n in names}
