"""Event ids: random version-4 UUIDs, as ``uuid.uuid4`` makes them, drawn from ``os.urandom`` in blocks.

``uuid4`` reads 16 bytes from ``os.urandom`` per id, and ``os.urandom`` gives up the interpreter lock around
its ``getrandom`` call: with many dispatching threads, another one takes the lock meanwhile and the caller
waits to get it back, a context switch or two per command for a few microseconds of work. Here each thread
reads ``BLOCK`` ids' bytes at once and hands them out 16 at a time; the ids are exactly as random (the same
source, every byte used once) and keep uuid4's version and variant bits.

A forked child never reuses its parent's bytes: every block read before a fork is dropped in the child
(``os.register_at_fork``), so parent and child cannot hand out the same id.
"""

from __future__ import annotations

import os
import threading
from uuid import UUID

#: ids per read of ``os.urandom``
BLOCK = 256
_SIZE = 16 * BLOCK
_VERSION_4 = UUID(int=0, version=4).int  # the version and variant bits uuid4 sets

_local = threading.local()
_generation = 0  # incremented in a forked child: its inherited blocks are stale


def _forked() -> None:
    global _generation
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def new_id() -> UUID:
    """A random version-4 UUID (what ``uuid.uuid4()`` returns)."""
    local = _local
    try:
        block, at, generation = local.block, local.at, local.generation
    except AttributeError:
        block, at, generation = b"", _SIZE, -1
    if at >= _SIZE or generation != _generation:
        block, at = os.urandom(_SIZE), 0
        local.block, local.generation = block, _generation
    local.at = at + 16
    value = int.from_bytes(block[at:at + 16], "big")
    # as ``UUID(bytes=..., version=4)``: clear the variant and version bits, then set them
    value = (value & ~(0xC000 << 48) & ~(0xF000 << 64)) | _VERSION_4
    return UUID(int=value)
