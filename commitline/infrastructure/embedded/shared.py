"""One embedded server per data folder, shared by every commitline process that uses the folder.

The first process that needs the server starts it; every later one attaches to the running
one; a process that leaves stops it only when no other process is using it and nobody pinned
it (``commitline up``). So a second ``commitline`` beside a running ``publish`` reuses its
PostgreSQL instead of restarting it under it.

Coordination uses ``flock`` on files next to the server's own folder. The kernel drops the
locks of a process that dies, ``kill -9`` included, so a crash never leaves a stale claim:

- ``<name>.lock``: held exclusively only while one process decides to start, attach or stop;
- ``<name>.users``: every process using the server holds a shared lock on it for as long as
  it does. A leaving process stops the server only if it can then take this lock
  exclusively (no other user) and ``<name>.pinned`` does not exist;
- ``<name>.pinned``: written by ``up`` (the server outlives its users), removed by ``down``.

Where the running server listens is read from the server itself (PostgreSQL's
``postmaster.pid``; the broker's ``<name>.json``), never assumed.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from commitline.infrastructure.embedded.errors import EmbeddedServiceError

S = TypeVar("S")


@dataclass
class Server(Generic[S]):
    """How to find a running server of a folder, start one, and stop one."""

    find: Callable[[], S | None]  # the server running for this folder, or None
    start: Callable[[], S]
    stop: Callable[[S], None]


class SharedServer(Generic[S]):
    """The server of one folder as this process uses it: ``acquire()`` once, ``release()`` once."""

    def __init__(self, folder: Path, name: str, server: Server[S]):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.name = name
        self.server = server
        self._users_fd: int | None = None
        self.instance: S | None = None
        self.started_here = False

    @property
    def pin_file(self) -> Path:
        return self.folder / f"{self.name}.pinned"

    def acquire(self) -> S:
        """The running server (attached) or a new one (started); this process counts as a user until
        ``release``."""
        with self._deciding():
            self._users_fd = _open(self.folder / f"{self.name}.users")
            fcntl.flock(self._users_fd, fcntl.LOCK_SH)
            try:
                found = self.server.find()
                self.instance, self.started_here = (found, False) if found is not None else (self.server.start(), True)
            except BaseException:
                self._leave()
                raise
            return self.instance

    def release(self) -> bool:
        """Stop using the server; stop it if this was its last user and it is not pinned. True if stopped."""
        if self._users_fd is None:
            return False
        with self._deciding():
            self._leave()
            if self.pin_file.exists() or self.in_use():
                return False
            running = self.server.find()
            if running is not None:
                self.server.stop(running)
            return running is not None

    def in_use(self) -> bool:
        """Whether any process (this one included while it is a user) uses the server."""
        fd = _open(self.folder / f"{self.name}.users")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def pin(self) -> None:
        self.pin_file.write_text(f"pinned by pid {os.getpid()}\n")

    def unpin(self) -> None:
        self.pin_file.unlink(missing_ok=True)

    def stop_if_unused(self, *, force: bool = False) -> tuple[bool, bool]:
        """For ``down``: (was running, stopped). Refuses (False) while other processes use it, unless ``force``."""
        with self._deciding():
            running = self.server.find()
            if running is None:
                return False, False
            if self.in_use() and not force:
                return True, False
            self.server.stop(running)
            return True, True

    def _leave(self) -> None:
        if self._users_fd is not None:
            os.close(self._users_fd)  # drops the shared lock
            self._users_fd = None

    @contextmanager
    def _deciding(self) -> Iterator[None]:
        fd = _open(self.folder / f"{self.name}.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise EmbeddedServiceError(f"cannot use the data folder {path.parent}: {e}") from None
