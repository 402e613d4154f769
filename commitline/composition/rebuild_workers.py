"""Rebuilding several projections in worker processes, one group each (``rebuild_many(..., jobs=N)``,
``commitline projections rebuild --all --jobs N``).

One process rebuilds on one core however many projections it rebuilds: decoding and applying events is Python
work under one interpreter lock. With ``jobs`` above 1 the projections are split into that many groups,
balanced by the events of the types each one handles (``split``, weighed with ``recorder.topic_counts``); this
process rebuilds the largest group (reading the log once for it, as ``rebuild_many`` does: no start-up cost),
and each other group is rebuilt by a worker process of its own (``rebuild_worker.py``), bootstrapped with this
process's settings, sent on its stdin (no secret is put on its command line or in its environment: it inherits
this process's environment as it is), and its domain (``module:attribute``).

Each projection's rebuild is the one ``rebuild`` does: its own lease, ``__next`` tables, saved position and
atomic swap, so groups never meet. A group that fails or is interrupted leaves the others standing (a projection
is swapped in when its own rebuild completes, whatever the other groups do), and running the same command again
resumes what did not finish. Interrupted (Ctrl-C, or any error in this process), this process interrupts every
worker as Ctrl-C would, and waits for them to stop; workers run in sessions of their own, so a terminal's Ctrl-C
reaches them once, from here. Killed (``kill -9``), it leaves none rebuilding: each worker is interrupted when its
parent dies.

A worker says what happens as one JSON object per line on its stdout (``rebuild_worker.py``); its log goes to
stderr, this process's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

import commitline
from commitline.infrastructure.config import Settings
from commitline.projections.rebuild import Progress, RebuildError, RebuildResult

#: The worker's module, run as ``python -m`` would, on the path its command line gives (``_BOOT``).
WORKER = "commitline.composition.rebuild_worker"
_BOOT = ("import runpy, sys; sys.path[:0] = sys.argv[1:]; del sys.argv[1:]; "
         f"runpy.run_module({WORKER!r}, run_name='__main__', alter_sys=True)")


def _package_root() -> str:
    """The folder holding the commitline package this process runs."""
    return str(Path(commitline.__file__).resolve().parents[1])

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
    """What every worker is given, besides its group: the settings, the domain as ``module:attribute``, and the
    rebuild's options."""

    settings: Settings
    domain: str
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
    """One worker process and the thread reading what it says."""

    def __init__(self, names: list[str], process: subprocess.Popen[str], progress: Progress):
        self.names = names
        self.process = process
        self.progress = progress
        self.outcome: list[RebuildResult] | str = f"the worker rebuilding {', '.join(names)} said nothing"
        self.interrupted = False
        self.reader = threading.Thread(target=self._read, name=f"rebuild-worker-{process.pid}", daemon=True)
        self.reader.start()

    @classmethod
    def start(cls, order: WorkerOrder, names: list[str], progress: Progress) -> _Worker:
        # The folder this process's commitline comes from, then this process's path, before anything is imported
        # (-P: not the working directory first, where another checkout's commitline would be found instead).
        process = subprocess.Popen([sys.executable, "-P", "-c", _BOOT, _package_root(), *sys.path],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert process.stdin is not None
        process.stdin.write(json.dumps({"settings": settings_values(order.settings), "domain": order.domain,
                                        "names": names, "batch_size": order.batch_size, "fresh": order.fresh,
                                        "path": sys.path, "parent": os.getpid()}) + "\n")
        process.stdin.close()
        return cls(names, process, progress)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                said = json.loads(line)
            except ValueError:
                continue  # not the protocol's (something the domain's code printed)
            if "progress" in said:
                self.progress(*said["progress"])
            elif "results" in said:
                self.outcome = [RebuildResult(**r) for r in said["results"]]
            elif "error" in said:
                self.outcome = str(said["error"])
            elif said.get("interrupted"):
                self.outcome = f"the rebuild of {', '.join(self.names)} was interrupted: run it again to resume"

    def interrupt(self) -> None:
        """As Ctrl-C would: the worker stops after its batch, releasing its leases (``wait`` kills it after
        ``STOP_SECONDS``)."""
        self.interrupted = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)

    def wait(self) -> list[RebuildResult] | str:
        """Its results, or why it has none."""
        try:
            code = self.process.wait(timeout=STOP_SECONDS if self.interrupted else None)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.reader.join()
        if isinstance(self.outcome, list) and code != 0:
            return f"the worker rebuilding {', '.join(self.names)} ended with exit status {code}"
        if not isinstance(self.outcome, list) and code < 0:
            return f"the worker rebuilding {', '.join(self.names)} was killed by signal {-code}: run it again to resume"
        return self.outcome


def settings_values(settings: Settings) -> dict[str, Any]:
    """``settings`` as JSON values ``Settings(**values)`` takes back, secrets in clear (for a worker's stdin only)."""
    values = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        values[name] = value.get_secret_value() if isinstance(value, SecretStr) else value
    return json.loads(json.dumps(values, default=str))
