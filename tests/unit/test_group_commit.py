"""The group committer's wake-up chain, with a recorder that stores nothing (no database): every decided
call's thread returns, however the calls' appends are spread over batches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from commitline.infrastructure.store.group_commit import GroupCommitter
from tests.support import wait_for


class Pending:
    """Stands for a ``PendingAppend``: the committer only reads ``size``; ``gate`` holds its batch open."""

    def __init__(self, gate: threading.Event | None = None):
        self.gate, self.size = gate, 1


class GatedRecorder:
    def append_batch(self, batch: Sequence[Any]) -> list[list[int]]:
        if batch[0].gate is not None:
            assert batch[0].gate.wait(30), "the test never opened this batch's gate"
        return [[i] for i in range(len(batch))]


def start(committer: GroupCommitter, pendings: list[Pending]) -> threading.Thread:
    thread = threading.Thread(target=committer.append_many, args=(pendings,), daemon=True)
    thread.start()
    return thread


def queued(committer: GroupCommitter, n: int) -> Callable[[], bool]:
    return lambda: len(committer._queue) == n


def test_calls_with_several_appends_in_another_leaders_batch_all_return() -> None:
    committer = GroupCommitter(GatedRecorder(), flushers=2)  # type: ignore[arg-type]
    first, second, third = threading.Event(), threading.Event(), threading.Event()
    leaders = [start(committer, [Pending(first)]), start(committer, [Pending(second)])]
    wait_for(lambda: committer._free == 0, what="both flush slots taken")
    third_leader = start(committer, [Pending(third)])
    wait_for(queued(committer, 1), what="the third leader queued")
    several = start(committer, [Pending(), Pending(), Pending()])  # one call, three appends
    wait_for(queued(committer, 4), what="the call with three appends queued")
    two = start(committer, [Pending(), Pending()])
    wait_for(queued(committer, 6), what="the call with two appends queued")
    lone = start(committer, [Pending()])
    wait_for(queued(committer, 7), what="the lone call queued")

    first.set()  # a slot frees: the third leader takes every queued append into its batch
    leaders[0].join(30)
    wait_for(queued(committer, 0), what="one batch holding all the queued appends")
    second.set()
    third.set()

    for thread in (*leaders, third_leader, several, two, lone):
        thread.join(30)
        assert not thread.is_alive(), "a decided call's thread was left asleep"
    assert not committer._done
