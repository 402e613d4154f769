"""A fleet of real ``commitline`` processes for tests, a load driver over HTTP, and an independent read of Kafka.

- :class:`Fleet` starts ``commitline`` subprocesses (``serve`` on a free port, ``publish``, ``project``,
  ``sagas run``...) with one environment (database URL, schema, broker), each writing its stdout and stderr to
  its own file in a log folder; ``cli()`` runs a one-shot command the same way; leaving the ``with`` block
  stops every process (SIGTERM, then wait; SIGKILL only after a minute).
- :class:`Load` keeps dispatching commands to ``serve`` over TCP from a few threads, each with an
  ``Idempotency-Key``, recording for every key its command and whether it was acknowledged (2xx) or not;
  ``retry_failed()`` sends the failed ones again with the SAME key until each is acknowledged.
- :func:`read_kafka` reads every record of the examples' topics with confluent-kafka (librdkafka, not the
  aiokafka the publisher uses); :func:`check_kafka` asserts that every stored event is there and that each
  aggregate's events come in version order once duplicates are dropped by event id.

The built-in examples' workload for it, and what it must leave behind, are in ``tests/fleet_workload.py``.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

from commitline.infrastructure.kafka.envelope import topic_for
from tests.kafka_reader import read_topics
from tests.support import AGGREGATES, MASTER_KEY, wait_for

STOP_TIMEOUT = 60


def fleet_env(database_url: str, schema: str, kafka: str, **extra: str) -> dict[str, str]:
    """The environment of every process of a fleet: ours without any COMMITLINE_/KAFKA_ variable, plus these
    (the defaults otherwise, so that recovery times are those of a deployment; the test broker cannot do
    idempotent producing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMITLINE_", "KAFKA_"))}
    return {**env, "COMMITLINE_DATABASE_URL": database_url, "COMMITLINE_SCHEMA": schema,
            "COMMITLINE_MASTER_KEY": MASTER_KEY, "KAFKA_BOOTSTRAP_SERVERS": kafka,
            "COMMITLINE_KAFKA_IDEMPOTENCE": "false", "COMMITLINE_KAFKA_TOPIC_PREFIX": f"{schema}.",
            "COMMITLINE_KAFKA_PARTITIONS": "4", **extra}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Fleet:
    """``commitline`` processes sharing ``env``; their output in ``logs``/NAME.log."""

    env: dict[str, str]
    logs: Path
    processes: dict[str, Process] = field(default_factory=dict)
    base_url: str = ""

    def start(self, name: str, *args: str) -> Process:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen([sys.executable, "-m", "commitline.cli", *args], env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.processes[name] = Process(name, popen, log)
        return self.processes[name]

    def serve(self, name: str = "serve") -> Process:
        """``commitline serve`` on a free port; returns once ``/readyz`` answers 200."""
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        process = self.start(name, "serve", "--port", str(port), "--no-access-log")
        wait_for(lambda: self.ready() == 200, "serve to be ready", timeout=120)
        return process

    def ready(self) -> int:
        """``/readyz``'s status code (0: no answer)."""
        for process in self.processes.values():
            assert process.alive(), f"{process.name} exited {process.popen.returncode}:\n{process.output()[-3000:]}"
        try:
            return httpx.get(f"{self.base_url}/readyz", timeout=10).status_code
        except httpx.TransportError:
            return 0

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "commitline.cli", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def api_key(self, tenant: str) -> str:
        made = self.cli("tenants", "add", tenant)
        assert made.returncode == 0, made.stderr
        return made.stdout.strip()

    def stop(self) -> dict[str, int]:
        """SIGTERM to every process still running, then wait for each; their exit codes."""
        for process in self.processes.values():
            if process.alive():
                process.popen.send_signal(signal.SIGTERM)
        codes = {}
        for name, process in self.processes.items():
            try:
                codes[name] = process.popen.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                codes[name] = process.popen.wait()
        return codes

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the load ------------------------------------------------------------------------------------------------

@dataclass
class Sent:
    """One command and its key: ``acked`` once a 2xx came back (``answer`` is its body), ``failures`` before
    (per HTTP status or transport error), the last refusal's body in ``refused``."""

    key: str
    command: dict[str, Any]
    acked: bool = False
    answer: dict[str, Any] | None = None
    failures: Counter[str] = field(default_factory=Counter)
    acked_at: float = 0.0
    refused: str = ""


class Load:
    """Threads sending ``commands(thread, n)`` to ``base_url`` with ``api_key``, each under a key of its own."""

    def __init__(self, base_url: str, api_key: str, commands: Callable[[int, int], dict[str, Any]],
                 threads: int = 3, tag: str = "load"):
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.commands = commands
        self.threads = threads
        self.tag = tag
        self.sent: dict[str, Sent] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def send(self, client: httpx.Client, sent: Sent) -> bool:
        try:
            answer = client.post("/v1/commands", json=sent.command, headers={"Idempotency-Key": sent.key})
        except httpx.TransportError as e:
            sent.failures[type(e).__name__] += 1
            return False
        if answer.is_success:
            sent.acked, sent.answer, sent.acked_at = True, answer.json(), time.monotonic()
            return True
        sent.failures[str(answer.status_code)] += 1
        sent.refused = answer.text[:500]
        return False

    def _work(self, thread: int) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30) as client:
            for n in itertools.count():
                if self._stop.is_set():
                    return
                sent = Sent(f"{self.tag}-{thread}-{n}", self.commands(thread, n))
                with self._lock:
                    self.sent[sent.key] = sent
                if not self.send(client, sent):
                    self._stop.wait(0.2)  # pacing while the store is away, not a wait for a condition

    def __enter__(self) -> Load:
        self._workers = [threading.Thread(target=self._work, args=(t,), name=f"{self.tag}-{t}", daemon=True)
                         for t in range(self.threads)]
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(60)

    def acked(self) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent.values() if s.acked]

    def failed(self) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent.values() if not s.acked]

    def wait_acked(self, more: int, what: str, timeout: float = 180) -> None:
        """Wait until ``more`` commands beyond those acknowledged now are acknowledged."""
        target = len(self.acked()) + more
        wait_for(lambda: len(self.acked()) >= target, what, timeout)

    def retry_failed(self, timeout: float = 180) -> int:
        """Send every unacknowledged command again with its key until each is acknowledged; how many there were."""
        failed = self.failed()
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30) as client:
            for sent in failed:
                while not self.send(client, sent):
                    assert time.monotonic() < deadline, (f"{sent.key} not acknowledged: {dict(sent.failures)}, "
                                                         f"the last refusal: {sent.refused}")
                    time.sleep(0.2)
        return len(failed)


def check_applied_once(dsn: str, schema: str, tenant: str, sent: list[Sent]) -> None:
    """Every key has its idempotency record, naming a stored event of the aggregate its answer named."""
    with psycopg.connect(dsn) as conn:
        records = {key: (str(a), v) for key, a, v in conn.execute(
            f"SELECT key, aggregate_id, stream_version FROM {schema}.idempotency_keys WHERE tenant = %s",
            (tenant,)).fetchall()}
        stored = set(conn.execute(f"SELECT originator_id::text, originator_version FROM {schema}.events").fetchall())
    missing = [s.key for s in sent if s.key not in records]
    assert not missing, f"{len(missing)} keys without their record, e.g. {missing[:5]}"
    for s in sent:
        assert s.answer is not None and records[s.key] == (str(s.answer["aggregate_id"]), s.answer["version"]), s
        assert records[s.key] in stored, f"{s.key}: its event {records[s.key]} is not stored"


# -- Kafka ---------------------------------------------------------------------------------------------------

def stored_events(dsn: str, schema: str) -> dict[str, tuple[str, int]]:
    """event id -> (aggregate id, version), straight from the store."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT originator_id, originator_version, state FROM {schema}.events").fetchall()
    return {orjson.loads(bytes(s))["id"]: (str(a), v) for a, v, s in rows}


def read_kafka(bootstrap_servers: str, prefix: str, aggregates: tuple[type, ...] | list[type] = AGGREGATES,
               timeout: float = 120) -> list[dict[str, Any]]:
    """The envelope of every record of the aggregates' topics, in partition order, each partition read from
    its beginning to its end (``tests/kafka_reader.py``); ``_kafka_ms`` added to each is the record's timestamp
    (CreateTime: when the publisher produced it)."""
    envelopes = []
    for r in read_topics(bootstrap_servers, [topic_for(prefix, a.__name__) for a in aggregates], timeout):
        envelope = orjson.loads(r.value)
        envelope["_kafka_ms"] = r.timestamp_ms
        envelopes.append(envelope)
    return envelopes


def check_kafka(stored: dict[str, tuple[str, int]], envelopes: list[dict[str, Any]]) -> int:
    """Every stored event is in Kafka and nothing else is, and each aggregate's events come in version order
    once duplicates are dropped by event id; returns the number of duplicates."""
    seen: set[str] = set()
    last: dict[str, int] = {}
    duplicates = 0
    for envelope in envelopes:
        if envelope["event_id"] in seen:
            duplicates += 1
            continue
        seen.add(envelope["event_id"])
        aggregate, version = envelope["aggregate_id"], envelope["version"]
        assert version == last.get(aggregate, 0) + 1, f"aggregate {aggregate}: {version} after {last.get(aggregate)}"
        last[aggregate] = version
    missing = set(stored) - seen
    assert not missing, f"{len(missing)} stored events missing from Kafka, e.g. {sorted(missing)[:3]}"
    unknown = seen - set(stored)
    assert not unknown, f"{len(unknown)} events in Kafka that the store does not hold, e.g. {sorted(unknown)[:3]}"
    return duplicates


def published_beyond(dsn: str, schema: str, position: int) -> bool:
    """Whether a publisher bucket's saved position (saved once the broker acknowledged) is beyond ``position``."""
    with psycopg.connect(dsn) as conn:
        [(furthest,)] = conn.execute(f"SELECT max(position) FROM {schema}.follower_positions "
                                     "WHERE starts_with(name, 'kafka-publisher/')").fetchall()
    return furthest is not None and furthest > position


# -- logs ----------------------------------------------------------------------------------------------------

OUTAGE_BEGAN = re.compile(r"(\S+): PostgreSQL unavailable \(")  # followers/outage.py, Outage.failed
OUTAGE_ENDED = re.compile(r"(\S+): PostgreSQL available again after")  # Outage.recovered


def outage_lines(text: str) -> tuple[Counter[str], Counter[str]]:
    """Per follower name, how many times a log said PostgreSQL went away, and came back."""
    return Counter(OUTAGE_BEGAN.findall(text)), Counter(OUTAGE_ENDED.findall(text))


def check_outage_logged_once(name: str, output: Callable[[], str], schema: str) -> None:
    """Each follower of the process logged the outage once as it began and once as it ended, under no other
    subject (neither as its handler's failure nor as a lost lease); each LISTEN wake-up connection once as it
    broke and once as it listened again. A standby follower (another process owns its work) learns the outage
    ended at its next attempt, up to its longest back-off after the owners caught up: waited for."""
    wait_for(lambda: (lambda b, e: b == e)(*outage_lines(output())), f"{name}'s followers to log the outage's end",
             timeout=60)
    log = output()
    began, ended = outage_lines(log)
    assert began and began == ended and set(began.values()) == {1}, (name, began, ended)
    assert log.count(" unavailable (") == len(began), (name, log[-5000:])  # Outage.failed's line, any subject
    assert "waiting to own" not in log, (name, log[-5000:])  # a broken lease session is that same outage
    broken, back = log.count(f"LISTEN {schema}_events failed"), log.count(f"LISTEN {schema}_events reconnected")
    assert broken == back <= len(began), (name, broken, back)
