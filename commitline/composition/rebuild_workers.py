"""Rebuilding several projections in worker processes, one group each (``rebuild_many(..., jobs=N)``,
``commitline projections rebuild --all --jobs N``).

One process rebuilds on one core however many projections it rebuilds: decoding and applying events is Python
work under one interpreter lock. With ``jobs`` above 1 the projections are split into that many groups,
balanced by the events of the types each one handles (``split``, weighed with ``recorder.topic_counts``); this
process rebuilds the largest group (reading the log once for it, as ``rebuild_many`` does), and each other group
is rebuilt by a worker process of its own, forked from this one: it starts with commitline and the domain already
imported and checked, and with this process's settings in memory (no secret passes through a command line, an
environment or a pipe), and opens connections of its own (``_work``). It uses nothing of this process's threads:
not a connection, pool or lock of theirs; and it ends with ``os._exit``, so nothing of this process is closed or
flushed twice.

Each projection's rebuild is the one ``rebuild`` does: its own lease, ``__next`` tables, saved position and
atomic swap, so groups never meet. A group that fails or is interrupted leaves the others standing (a projection
is swapped in when its own rebuild completes, whatever the other groups do), and running the same command again
resumes what did not finish. Interrupted (Ctrl-C, or any error in this process), this process interrupts every
worker as Ctrl-C would, and waits for them to stop; workers run in sessions of their own, so a terminal's Ctrl-C
reaches them once, from here. Killed (``kill -9``), it leaves none rebuilding: each worker is interrupted when its
parent dies.

A worker says what happens as one JSON object per line on a pipe to this process: ``{"progress": [position,
head, applied]}`` per batch, then ``{"results": [...]}``, ``{"error": "..."}`` or ``{"interrupted": true}``; its
log goes to stderr, this process's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from commitline.composition.orphans import end_with_parent
from commitline.projections.rebuild import Progress, RebuildError, RebuildResult

#: How long an interrupted worker may take to stop (finish its batch, release its leases) before it is killed.
STOP_SECONDS = 60.0


def available_cores() -> int:
    """The cores this process may run on (its affinity, which a container's CPU set narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def split(weights: Mapping[str, int], jobs: int) -> list[list[str]]:
    """The projections (name: the events it handles) in at most ``jobs`` groups of near-equal weight, heaviest
    group first: each projection, heaviest first, joins the lightest group so far, of those the one with the
    fewest projections (ties by name and order, so a split is always the same). No group is empty."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(jobs, len(weights))))]
    loads = [0] * len(groups)
    for name in sorted(weights, key=lambda n: (-weights[n], n)):
        lightest = min(range(len(groups)), key=lambda g: (loads[g], len(groups[g]), g))
        groups[lightest].append(name)
        loads[lightest] += weights[name]
    order = sorted(range(len(groups)), key=lambda g: -loads[g])
    return [sorted(groups[g]) for g in order if groups[g]]


@dataclass(frozen=True)
class WorkerOrder:
    """What every worker is given, besides its group: how to open a Commitline of its own (``Commitline.reopen``:
    this process's settings and domain, new connections), and the rebuild's options."""

    reopen: Callable[[], Any]
    batch_size: int
    fresh: bool


def rebuild_in_workers(groups: list[list[str]], here: Callable[[list[str], Progress], list[RebuildResult]],
                       order: WorkerOrder, progress: Progress | None) -> list[RebuildResult]:
    """The first group rebuilt by ``here(names, progress)`` in this process, each other one by a worker process,
    all at once (see the module's docstring); every result, in the groups' order."""
    combined = _CombinedProgress(len(groups), progress)
    workers: list[_Worker] = []
    failures: list[str] = []
    try:
        for k, group in enumerate(groups[1:], start=1):
            workers.append(_Worker.start(order, group, combined.of(k)))
        for worker in workers:  # once every worker is forked: no fork happens while a reader holds a lock
            worker.listen()
        try:
            own = here(groups[0], combined.of(0))
        except RebuildError as e:  # this group stopped (a poison event, a rebuild running): the workers' go on
            own = []
            failures.append(str(e))
        outcomes = [worker.wait() for worker in workers]
    except BaseException:
        for worker in workers:
            worker.interrupt()
        for worker in workers:
            worker.wait()
        raise
    results = list(own)
    for outcome in outcomes:
        if isinstance(outcome, list):
            results.extend(outcome)
        else:
            failures.append(outcome)
    if failures:
        done = "; rebuilt and swapped in meanwhile: " + ", ".join(r.projection for r in results) if results else ""
        raise RebuildError("; ".join(failures) + done)
    return results


class _CombinedProgress:
    """One progress for all groups: the lowest position any group reached, the highest head, the events applied
    by all (each group reports its own, from its own thread)."""

    def __init__(self, groups: int, progress: Progress | None):
        self.progress = progress
        self.reports = [(0, 0, 0)] * groups
        self.lock = threading.Lock()

    def of(self, group: int) -> Progress:
        def report(position: int, head: int, applied: int) -> None:
            if self.progress is None:
                return
            with self.lock:
                self.reports[group] = (position, head, applied)
                self.progress(min(r[0] for r in self.reports), max(r[1] for r in self.reports),
                              sum(r[2] for r in self.reports))
        return report


class _Worker:
    """One forked worker process and the thread reading what it says."""

    def __init__(self, names: list[str], pid: int, said: IO[str], progress: Progress):
        self.names = names
        self.pid = pid
        self.said = said
        self.progress = progress
        self.outcome: list[RebuildResult] | str = f"the worker rebuilding {', '.join(names)} said nothing"
        self.interrupted = False
        self.code: int | None = None
        self.reader = threading.Thread(target=self._read, name=f"rebuild-worker-{pid}", daemon=True)

    def listen(self) -> None:
        """Start reading what it says (once)."""
        if self.reader.ident is None:
            self.reader.start()

    @classmethod
    def start(cls, order: WorkerOrder, names: list[str], progress: Progress) -> _Worker:
        parent = os.getpid()
        readable, writable = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # what this process wrote is not the worker's to write again
            stream.flush()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns of fork() beside threads: a lock another thread holds stays held in the child.
                # The worker takes none of theirs: it opens its own connections and pools (``_work``).
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            os.close(readable)
            os.close(writable)
            raise
        if pid == 0:
            code = 1
            try:
                os.close(readable)
                code = _work(order, names, parent, os.fdopen(writable, "w"))
            finally:
                os._exit(code)
        os.close(writable)
        return cls(names, pid, os.fdopen(readable), progress)

    def _read(self) -> None:
        with self.said:
            for line in self.said:
                try:
                    said = json.loads(line)
                except ValueError:  # a line cut short by the worker's death: its exit status says the rest
                    continue
                if "progress" in said:
                    self.progress(*said["progress"])
                elif "results" in said:
                    self.outcome = [RebuildResult(**r) for r in said["results"]]
                elif "error" in said:
                    self.outcome = str(said["error"])
                elif said.get("interrupted"):
                    self.outcome = f"the rebuild of {', '.join(self.names)} was interrupted: run it again to resume"

    def _signal(self, sig: int) -> None:
        if self.code is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # a zombie is still there to be reaped, so this is not a reused pid
                pass

    def interrupt(self) -> None:
        """As Ctrl-C would: the worker stops after its batch, releasing its leases (``wait`` kills it after
        ``STOP_SECONDS``)."""
        self.interrupted = True
        self._signal(signal.SIGINT)

    def wait(self) -> list[RebuildResult] | str:
        """Its results, or why it has none."""
        if self.code is None:
            self.listen()
            self.reader.join(STOP_SECONDS if self.interrupted else None)  # its pipe closes when it ends
            if self.reader.is_alive():
                self._signal(signal.SIGKILL)
                self.reader.join()
            self.code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        code = self.code
        if isinstance(self.outcome, list) and code != 0:
            return f"the worker rebuilding {', '.join(self.names)} ended with exit status {code}"
        if not isinstance(self.outcome, list) and code < 0:
            return f"the worker rebuilding {', '.join(self.names)} was killed by signal {-code}: run it again to resume"
        return self.outcome


def _work(order: WorkerOrder, names: list[str], parent: int, out: IO[str]) -> int:
    """The forked worker: rebuild ``names`` on connections of its own, saying what happens on ``out``; its exit
    status. It runs in a session of its own (a terminal's Ctrl-C reaches it from its parent only), interrupted,
    as by Ctrl-C, by SIGINT and by its parent's death: a worker never rebuilds on unattended."""
    def say(message: dict[str, Any]) -> None:
        try:
            out.write(json.dumps(message) + "\n")
            out.flush()
        except OSError:  # the parent is gone (its end of the pipe with it): it is interrupting this one
            pass

    try:
        os.setsid()
        # SIGINT made Python's own: a command started in the background by a script (``cmd &`` in a
        # non-interactive shell) has it ignored, and the parent's Ctrl-C as well as its death would do nothing.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)  # the parent's event loop, if it has one, must not hear this process's signals
        if not end_with_parent(signal.SIGINT, parent):
            raise KeyboardInterrupt
        with order.reopen() as app:
            results = app.rebuild_many(names, batch_size=order.batch_size, fresh=order.fresh,
                                       progress=lambda position, head, applied: say(
                                           {"progress": [position, head, applied]}))
    except KeyboardInterrupt:
        say({"interrupted": True})
        return 130
    except Exception as e:  # every error is said to the parent, which reports it with the others
        say({"error": str(e) if isinstance(e, RebuildError) else f"{type(e).__name__}: {e}"})
        return 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    say({"results": [dataclasses.asdict(r) for r in results]})
    return 0
