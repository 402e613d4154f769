"""Event ids drawn in blocks (``domain/ids.py``): uuid4's format, never repeated, not across threads, not in a
forked child (which inherits its parent's unused block)."""

from __future__ import annotations

import os
import threading
from uuid import UUID

import pytest

from commitline.domain import ids


def test_ids_are_version_4_uuids_like_uuid4() -> None:
    for _ in range(2 * ids.BLOCK + 3):  # across block boundaries
        value = ids.new_id()
        assert isinstance(value, UUID)
        assert value.version == 4
        assert value.variant == "specified in RFC 4122"
        assert UUID(str(value)) == value


def test_no_id_repeats_within_or_across_threads() -> None:
    seen: list[list[UUID]] = [[] for _ in range(8)]

    def draw(i: int) -> None:
        seen[i].extend(ids.new_id() for _ in range(3 * ids.BLOCK))

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [u for per_thread in seen for u in per_thread]
    assert len(set(every)) == len(every) == 8 * 3 * ids.BLOCK


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_hand_out_its_parents_next_ids() -> None:
    ids.new_id()  # this thread now holds a block with unused ids, which the child inherits
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first ids, as text, to the parent
        try:
            os.close(read)
            os.write(write, "\n".join(str(ids.new_id()) for _ in range(8)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as child_out:
        child = {UUID(line) for line in child_out.read().split()}
    os.waitpid(pid, 0)
    parent = {ids.new_id() for _ in range(8)}
    assert len(child) == 8
    assert not child & parent
