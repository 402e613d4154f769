"""The per-process aggregate cache: the decoded state of recently written streams, so the next command
on a stream reads only the events after the cached version (usually none) instead of a snapshot and its tail.

An entry is lent out, not shared: ``take`` removes it, and the event store puts the aggregate back
only after an append of it committed (so it is exactly the stored head). A command that was refused, or
lost a race, simply leaves no entry behind, and the next load of that stream is a full one. An entry is
never trusted on its own: every load also reads the events stored after its version, so another
process's writes are applied, not missed, and a decision on a state that went stale between that read
and the append is refused by the append's version check (then the processor reloads).

Bounded: least recently used entries go first. Size 0 disables it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from uuid import UUID

from commitline.domain import Aggregate


@dataclass(frozen=True)
class Entry:
    aggregate: Aggregate
    owner: str  # the tenant that owns the stream
    head_hash: bytes  # the chain hash of the event at ``aggregate.version``


class AggregateCache:
    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[UUID, Entry] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, aggregate_id: UUID) -> Entry | None:
        if not self.size:
            return None
        with self._lock:
            return self._entries.pop(aggregate_id, None)

    def put(self, entry: Entry) -> None:
        if not self.size:
            return
        with self._lock:
            self._entries[entry.aggregate.id] = entry
            self._entries.move_to_end(entry.aggregate.id)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
