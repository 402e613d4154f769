"""What one follower instance owns, in memory, and how it changes hands (``engine.py``'s ``Follower`` is one).

Each owned slot (a plain follower's one position, a publish instance's buckets) has its position in memory
(possibly ahead of its row: a watermark not saved yet), what its row says, and its status. Slots change
hands only between two rounds (under the round lock): taking one reads its row; handing one back saves a
move not saved yet first, so the next owner starts exactly after what this one handled. A slot stopped at
a poison event stays stopped until an operator decides (``retry`` or ``skip`` changes its row), as does one
taken behind a store that went back (``went_back.py``: until ``followers reset``), and
``--drain`` is done once every slot, owned here or by another instance, reached the head it had when
draining began or stopped at a poison event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from commitline.application.errors import StoreUnavailable
from commitline.infrastructure.followers.fenced import LeaseLost
from commitline.infrastructure.followers.group import GroupLease
from commitline.infrastructure.followers.lease import Lease
from commitline.infrastructure.followers.reading import PageReader
from commitline.infrastructure.followers.shared import SharedWakeup


@dataclass
class Slot:
    """A position this instance owns."""

    position: int  # every event of the slot at or below it is handled (in memory)
    saved: int  # ... and this is what its row says
    status: str  # as its row says: running, retrying, or failed (stopped at a poison event)


class OwnedSlots:
    lease: Lease | GroupLease
    logger: logging.Logger
    owner: str
    reader: PageReader
    wakeup: SharedWakeup
    on_caught_up: Callable[[], None] | None
    on_poisoned: Callable[[], None] | None

    def __init__(self) -> None:
        self.slots: dict[int, Slot] = {}
        self._others: dict[int, tuple[int, str]] = {}  # slot -> (position, status) saved, for slots others own
        self._stopped: set[int] = set()  # slots stopped at a poison event (kept after they left)
        self._round = asyncio.Lock()  # held by a round; slots change hands between rounds
        self._saved_at = 0.0
        self._drain_head: int | None = None
        self._drained = False

    def moved(self) -> None:
        """Positions moved (a follower's metrics may follow them)."""

    def activated(self, slots: Sequence[int]) -> None:
        """``slots`` begin work here, taken or resumed after an operator's decision (the publisher checks the
        broker before it sends anything of them)."""

    @property
    def waiting_for_operator(self) -> bool:
        # a slot stopped here, then handed over, waits no more once its row says an operator let it go on
        waiting = {s for s in self._stopped if s not in self._others or self._others[s][1] == "failed"}
        return bool(waiting) or any(s.status == "failed" for s in self.slots.values())

    @property
    def owned(self) -> list[int]:
        return sorted(self.slots)

    @property
    def positions(self) -> dict[int, int]:
        """The position of each slot this instance owns (in memory: possibly ahead of its row)."""
        return {s: slot.position for s, slot in self.slots.items()}

    async def take(self, candidates: Sequence[int], wanted: int) -> list[int]:
        """Take up to ``wanted`` of ``candidates`` that nobody owns (a group follower's ``rebalance``), all
        at once between two rounds; the ones taken."""
        assert isinstance(self.lease, GroupLease)
        taken: list[int] = []
        for slot in candidates:
            if len(taken) >= wanted:
                break
            if await asyncio.to_thread(self.lease.take, slot):
                taken.append(slot)
        if taken:
            await self._took(await asyncio.to_thread(self.lease.rows, taken))
        return taken

    async def _took(self, rows: dict[int, tuple[int, str]], announce: bool = False) -> None:
        async with self._round:
            for slot, (position, status) in rows.items():
                self.slots[slot] = Slot(position, position, status)
                self._others.pop(slot, None)
                if announce:
                    self.logger.info("%s: %s active from position %d", self.lease.names[slot], self.owner, position)
            going_on = [s for s, (_, status) in rows.items() if status != "failed"]
            self._stopped.difference_update(going_on)  # stopped here before, let go on since
            self.activated(going_on)
        if rows:
            self.moved()
            self.wakeup.poke()

    async def hand_back(self, slots: Sequence[int], status: str = "stopped") -> None:
        """Give up ``slots``, between two rounds, saving moves not saved yet."""
        async with self._round:
            for s in slots:
                slot = self.slots.pop(s, None)
                if slot is None:
                    continue
                self._others[s] = (slot.position, slot.status)
                await asyncio.to_thread(self.lease.hand_back, s, slot.position if slot.position != slot.saved else None,
                                        status)

    async def _resume_decided(self) -> None:
        """Slots stopped at a poison event go on once an operator decided (``retry``/``skip``)."""
        stopped = [s for s, slot in self.slots.items() if slot.status == "failed"]
        if not stopped:
            return
        rows = await asyncio.to_thread(self.lease.rows, stopped)
        resumed = False
        async with self._round:
            for s, (position, status) in rows.items():
                if s in self.slots and status != "failed":
                    self.logger.info("%s: goes on from position %d (an operator decided)", self.lease.names[s], position)
                    self.slots[s] = Slot(position, position, status)
                    self._stopped.discard(s)
                    self.activated([s])
                    resumed = True
        if resumed:
            self.moved()
            self.wakeup.poke()

    async def _leave(self, status: str, summary: str) -> None:
        """Hand back every slot (saving moves not saved yet) marked ``status``, write the group's row (status
        ``summary``) if this instance kept it, and let go of the ownership."""
        self.reader.forget()
        if self.slots:
            owned = sorted(self.slots)
            await self.hand_back(owned, status)
            try:
                await asyncio.to_thread(self.lease.handed_back, owned, summary)
            except (LeaseLost, StoreUnavailable):
                pass
        await asyncio.to_thread(self.lease.leave, status)

    async def _save(self, rows: list[tuple[int, int, dict[str, Any] | None]]) -> None:
        """Save ``rows`` (slot, position, poison or None) in one statement on the fenced connection."""
        if rows:
            await asyncio.to_thread(self.lease.save, rows)
        for s, position, poison in rows:
            slot = self.slots[s]
            slot.position = slot.saved = position
            slot.status = "running" if poison is None else "failed"
        self._saved_at = time.monotonic()

    def _check_drained(self) -> None:
        """``--drain``: done once every slot reached the head it had when draining began, or stopped at a
        poison event (then ``on_poisoned``, else ``on_caught_up``)."""
        head = self._drain_head
        if head is None or self._drained:
            return
        failed = []
        for s in range(len(self.lease.names)):
            slot = self.slots.get(s)
            position, status = (slot.position, slot.status) if slot else self._others.get(s, (0, "never run"))
            if status == "failed":
                failed.append(s)
            elif position < head:
                return
        self._drained = True
        if failed:
            self._stopped.update(failed)
            if self.on_poisoned is not None:
                self.on_poisoned()
        elif self.on_caught_up is not None:
            self.on_caught_up()

