"""The tamper-evident hash chain over each stream's stored events.

For the event at version v of a stream:
    content_v = aggregate id, version, type and the stored state bytes (which hold the
                event id, timestamp, tenant and payload), NUL-separated
    hash_v    = SHA-256(prev_v || content_v),   prev_v = hash_{v-1},  prev_1 = GENESIS
Both ``prev_hash`` and ``event_hash`` are stored with the event, in its insert, so a
verifier can tell a changed event (its content no longer matches its hash) from a broken
link (its prev_hash no longer matches the event before it: something was removed,
inserted or reordered). Removing the *last* events of a stream leaves a valid chain; the
verifier detects that with the idempotency records, which keep each command's version.

``chain`` links the events of one stream; ``chain_streams`` the events of any streams, each continuing from
the hash of the event before it, wherever that is known (both recorders' appends use it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from uuid import UUID

GENESIS = bytes(32)


def content(originator_id: UUID, version: int, topic: str, state: bytes) -> bytes:
    return b"\x00".join((str(originator_id).encode(), str(version).encode(), topic.encode(), state))


def stream_prefix(originator_id: UUID) -> bytes:
    """The part of ``content`` every event of the stream starts with (a verifier builds it once per stream)."""
    return str(originator_id).encode() + b"\x00"


def link(prev_hash: bytes, event_content: bytes) -> bytes:
    return hashlib.sha256(prev_hash + event_content).digest()


class Chainable(Protocol):
    originator_id: UUID
    originator_version: int
    topic: str
    state: bytes


def chain(prev_hash: bytes, events: Sequence[Chainable]) -> list[tuple[bytes, bytes]]:
    """(prev_hash, event_hash) for each event, continuing from ``prev_hash``."""
    links = []
    for e in events:
        event_hash = link(prev_hash, content(e.originator_id, e.originator_version, e.topic, e.state))
        links.append((prev_hash, event_hash))
        prev_hash = event_hash
    return links


def chain_streams(events: Sequence[Chainable], stored_hash: Callable[[Any, int], bytes]) -> list[tuple[bytes, bytes]]:
    """(prev_hash, event_hash) for each of ``events`` (of any streams, each stream's in version order): an event
    continues from the one before it in ``events``, else from ``stored_hash(originator_id, version - 1)``."""
    links: list[tuple[bytes, bytes]] = []
    heads: dict[Any, tuple[int, bytes]] = {}
    for e in events:
        known = heads.get(e.originator_id)
        prev = known[1] if known and known[0] == e.originator_version - 1 else stored_hash(
            e.originator_id, e.originator_version - 1)
        links.append(chain(prev, [e])[0])
        heads[e.originator_id] = (e.originator_version, links[-1][1])
    return links
