"""The postmaster of a PostgreSQL data folder, as its ``postmaster.pid`` tells it.

Owns :class:`Postmaster`: which process (if any) serves the folder and on which port, a simulated crash
(:meth:`Postmaster.kill`), and clearing what a previous server left before a new start
(:meth:`Postmaster.clear_leftover`).

**Stale ``postmaster.pid``.** After a ``SIGKILL`` of the postmaster the pid file stays. If that pid is
gone, ``pg_ctl``/``postgres`` cope by themselves (crash recovery runs; verified). But the killed
postmaster is re-parented to init and stays a *zombie* until init reaps it -- on this machine 1-2 s --
and meanwhile postgres takes the pid for alive and refuses ("lock file already exists").
:meth:`Postmaster.clear_leftover` therefore removes a pid file whose pid is a zombie, or an unrelated live
process (pid reuse), or is unreadable. That is safe: since PostgreSQL 12 the shared-memory interlock is
keyed on the data folder's inode, so postgres still refuses while backends of the old server are attached
(the start retries that until its timeout). If the pid is a *live* postgres serving this same folder -- a
leftover of a run whose Python process was killed (``pg_ctl`` detaches the server, so it outlives its
parent), or one that was SIGKILLed a moment ago and is still dying -- it is asked to stop (SIGINT = fast
shutdown, escalating to SIGQUIT, SIGKILL) so that the server can be started again with the new settings.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from pathlib import Path

import psutil

from commitline.infrastructure.embedded.errors import EmbeddedServiceError

__all__ = ["Postmaster"]

_logger = logging.getLogger(__name__)

_PID_NAME = "postmaster.pid"


class Postmaster:
    """The server process recorded in ``<data_dir>/postmaster.pid``."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir

    @property
    def _pid_file(self) -> Path:
        return self._data_dir / _PID_NAME

    def pid(self) -> int | None:
        """The postmaster's pid (line 1), None if there is no readable server pid."""
        try:
            pid = int(self._pid_file.read_text().splitlines()[0].strip())
        except (OSError, IndexError, ValueError):
            return None
        return pid if pid > 0 else None  # negative: a single-user backend (initdb), not a server

    def listening_port(self) -> int | None:
        """The port the running server listens on: line 4 of ``postmaster.pid``."""
        try:
            return int(self._pid_file.read_text().splitlines()[3].strip())
        except (OSError, IndexError, ValueError):
            return None

    def state(self) -> str:
        """Classify ``postmaster.pid``.

        ``none`` no file; ``garbage`` unreadable; ``gone`` pid not alive;
        ``zombie`` killed, not reaped; ``ours`` a live postgres whose working
        folder is this data folder; ``foreign`` a live unrelated process
        (pid reuse); ``unknown`` cannot tell (no permission).
        """
        if not self._pid_file.exists():
            return "none"
        pid = self.pid()
        if pid is None:
            return "garbage"
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return "zombie"
            # The postmaster chdir()s into its data folder.
            if Path(proc.cwd()).resolve() == self._data_dir.resolve():
                return "ours"
            return "foreign"
        except psutil.NoSuchProcess:
            return "gone"
        except psutil.AccessDenied:
            return "unknown"

    def kill(self) -> None:
        """SIGKILL the postmaster serving this folder; return once it and its backends are dead."""
        pid = self.pid()
        if pid is None or self.state() != "ours":
            return
        try:
            postmaster = psutil.Process(pid)
            processes = [postmaster, *postmaster.children()]
            postmaster.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in processes):
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(f"PostgreSQL (pid {pid}) serving {self._data_dir} survived SIGKILL")
            time.sleep(0.02)

    def clear_leftover(self, deadline: float) -> None:
        """Deal with an existing ``postmaster.pid`` before starting (see module doc)."""
        pid_file = self._pid_file
        # fast shutdown, immediate shutdown, kill -- each given time to work
        escalation = iter(((signal.SIGINT, 10.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 2.0)))
        # a postmaster SIGKILLed a moment ago may still look alive: give it a moment first
        next_signal_at = time.monotonic() + 0.2
        while True:
            state = self.state()
            if state in ("none", "gone", "unknown"):
                return  # postgres itself copes with a pid file whose process is gone
            if state in ("garbage", "foreign", "zombie"):
                # zombie: the old postmaster is dead but not yet reaped by its
                # parent (init, which may take a second or two); postgres would
                # see the pid as alive and refuse. Removing the file is safe: since
                # PG 12 the shared-memory interlock keys on the data folder's inode,
                # so postgres still refuses while old backends are attached.
                _logger.info("removing stale %s (%s, pid %s)", pid_file, state, self.pid())
                pid_file.unlink(missing_ok=True)
                return
            # ours: a live postmaster serves this folder -- a leftover of a killed
            # run, or one SIGKILLed a moment ago that has not died yet.
            now = time.monotonic()
            if now > deadline:
                raise EmbeddedServiceError(
                    f"the leftover PostgreSQL (pid {self.pid()}) serving {self._data_dir} did not stop"
                )
            if now >= next_signal_at:
                sig, patience = next(escalation, (signal.SIGKILL, 2.0))
                pid = self.pid()
                if sig == signal.SIGINT:
                    _logger.warning(
                        "a PostgreSQL (pid %s) is already serving %s; stopping it to start with our settings",
                        pid,
                        self._data_dir,
                    )
                if pid is not None:
                    with contextlib.suppress(psutil.Error):
                        psutil.Process(pid).send_signal(sig)
                next_signal_at = now + patience
            time.sleep(0.02)


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a killed process whose parent has not reaped it yet is dead)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
