"""The per-process aggregate cache: the decoded state of recently written streams, so the next command
on a stream reads only the events after the cached version (usually none) instead of a snapshot and its tail.

An entry is lent out, not shared: ``take`` removes it, and the event store puts the aggregate back
only after an append of it committed (so it is exactly the stored head). A command that was refused, or
lost a race, simply leaves no entry behind, and the next load of that stream is a full one.

An entry may be decided on without any read (the processor's first run, ``trust_cache``): a stale one
cannot be stored, because the append's version check refuses it (and its predecessor check, when the
history it continues is no longer stored), and then the processor reads and decides again. A stream where
that happened is ``distrust``-ed: every later load of it reads the events stored after the cached version
first (so two processes writing one stream pay one read per command, not a wasted append).

Bounded: least recently used entries (and distrusted ids) go first. Size 0 disables it.

``clear`` (after an erasure: a decoded aggregate may hold the erased values) also refuses every aggregate
decoded before it and put back after it: ``put`` is given the ``epoch`` its aggregate was decoded in.
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


class AggregateCache:
    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[UUID, Entry] = OrderedDict()
        self._distrusted: OrderedDict[UUID, None] = OrderedDict()
        self._lock = threading.Lock()
        self.epoch = 0  # how many times it was cleared

    def take(self, aggregate_id: UUID) -> Entry | None:
        if not self.size:
            return None
        with self._lock:
            return self._entries.pop(aggregate_id, None)

    def put(self, entry: Entry, epoch: int | None = None) -> None:
        """Keep ``entry``, whose aggregate was decoded in ``epoch`` (None: now); not if cleared since."""
        if not self.size:
            return
        with self._lock:
            if epoch is not None and epoch != self.epoch:
                return
            held = self._entries.get(entry.aggregate.id)
            if held is not None and held.aggregate.version > entry.aggregate.version:
                return  # a later append of this stream put its copy first: keep the newer one
            self._entries[entry.aggregate.id] = entry
            self._entries.move_to_end(entry.aggregate.id)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry (after an erasure: a decoded aggregate may hold the erased values)."""
        with self._lock:
            self.epoch += 1
            self._entries.clear()

    def trusted(self, aggregate_id: UUID) -> bool:
        """May a cached copy of this stream be decided on without a read?"""
        return aggregate_id not in self._distrusted

    def distrust(self, aggregate_id: UUID) -> None:
        if not self.size:
            return
        with self._lock:
            self._distrusted[aggregate_id] = None
            self._distrusted.move_to_end(aggregate_id)
            while len(self._distrusted) > self.size:
                self._distrusted.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
