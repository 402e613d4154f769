"""The one CPU the threads that dispatch commands share (``COMMITLINE_DISPATCH_CPU``).

A Python process runs Python on one core at a time (the interpreter lock), and a command hands that lock
over several times: to the thread that commits its batch, back to its own thread when the batch is in.
When those threads may run on any core, each hand-over to a thread on the other core is an
inter-processor wake-up that finds cold caches. Measured with 32 writers on 2 cores: about 6 context
switches and 270 µs of CPU per command with the threads free, about 1.7 and 150 µs with all of them on
one core, nearly twice the commands/s (``make bench`` shows both ways). The database server is not
affected: it keeps every core.

- ``off``: no thread's CPU affinity is touched.
- ``N``: CPU N, which must be one this process may run on.
- ``auto``: a CPU this process claims: of the CPUs it may run on, the highest-numbered one that no other
  process on this machine has claimed (CPU 0 tends to take most of the machine's interrupts), or, with every
  one claimed, the one this process's id picks. A claim is a lock file per CPU in the temporary folder, held
  while the app is open and let go of by the kernel when the process ends, kill -9 included. Several
  processes (``commitline serve --workers``) so spread over the cores. With one usable CPU, or without
  thread affinity in the OS (not Linux), nothing is done.

A thread is moved at its first command and stays there: moving it back after each command costs more than
it saves. Like ``taskset``, the setting is inherited by threads and programs that thread starts later.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import IO

from commitline.application.errors import ConfigurationError
from commitline.infrastructure.config import DISPATCH_CPU_VALUES

log = logging.getLogger(__name__)

VARIABLE = "COMMITLINE_DISPATCH_CPU"
SETTING = re.compile(DISPATCH_CPU_VALUES)
CLAIMS = Path(tempfile.gettempdir()) / "commitline-dispatch-cpu"


def usable_cpus() -> set[int]:
    """The CPUs the calling thread may run on (empty where the OS has no thread affinity)."""
    getter = getattr(os, "sched_getaffinity", None)
    return set(getter(0)) if getter is not None else set()


class DispatchCpu:
    """Moves each thread that dispatches onto ``cpu`` at its first command (``cpu`` None: never)."""

    def __init__(self, cpu: int | None, claim: IO[bytes] | None = None):
        self.cpu = cpu
        self._claim = claim
        self._moved = threading.local()

    @classmethod
    def from_setting(cls, value: str) -> DispatchCpu:
        """``off``, ``auto`` or a CPU number (see the module's docstring); ConfigurationError if unusable."""
        if not SETTING.fullmatch(value):
            raise ConfigurationError(VARIABLE, f"must be off, auto or a CPU number (got {value!r})")
        usable = usable_cpus()
        if value == "off" or not hasattr(os, "sched_setaffinity"):
            return cls(None)
        if value == "auto":
            if len(usable) < 2:
                return cls(None)
            chosen = cls(*_claim(sorted(usable, reverse=True)))
        else:
            if int(value) not in usable:
                raise ConfigurationError(VARIABLE, f"CPU {value} is not one this process may run on "
                                         f"({', '.join(map(str, sorted(usable)))})")
            chosen = cls(int(value))
        log.info("threads that dispatch commands run on CPU %d (%s=%s%s)", chosen.cpu, VARIABLE, value,
                 ", every CPU already claimed: shared" if value == "auto" and chosen._claim is None else "")
        return chosen

    def enter(self) -> None:
        """Called by a thread before each command it dispatches; moves it once."""
        if self.cpu is None or getattr(self._moved, "done", False):
            return
        self._moved.done = True
        try:
            os.sched_setaffinity(0, {self.cpu})
        except OSError as e:  # e.g. the CPU went offline: the command runs anyway, on any core
            log.warning("cannot move a dispatching thread to CPU %d: %s", self.cpu, e)

    def close(self) -> None:
        """Let go of the claimed CPU (threads already moved stay where they are)."""
        if self._claim is not None:
            self._claim.close()
            self._claim = None


def _claim(cpus: list[int]) -> tuple[int, IO[bytes] | None]:
    """The first CPU of ``cpus`` that no other process holds, with the open file whose lock holds it."""
    with contextlib.suppress(OSError):
        CLAIMS.mkdir(mode=0o777, exist_ok=True)
    for cpu in cpus:
        try:
            claim = open(CLAIMS / f"cpu{cpu}.lock", "ab")  # noqa: SIM115 - open as long as the app
        except OSError:  # e.g. created by another user: count it as claimed
            continue
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            claim.close()
            continue
        return cpu, claim
    return cpus[os.getpid() % len(cpus)], None
