"""The local services of a data folder (``COMMITLINE_DATA_DIR``): its embedded PostgreSQL and its
embedded Kafka-protocol broker, each shared by every commitline process that uses the folder
(``shared.py`` says how).

The PostgreSQL keeps its data in the folder. The broker (Tansu, memory storage: the only storage
its bundled build has) keeps records in memory only: they are gone when it stops, i.e. when the
last process using it exits (or at ``commitline down``). It is for demos and local runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from commitline.infrastructure.embedded.kafka import EmbeddedKafka
from commitline.infrastructure.embedded.loopback import is_free, listens
from commitline.infrastructure.embedded.postgres import EmbeddedPostgres
from commitline.infrastructure.embedded.shared import Server, SharedServer

POSTGRES = "postgres"
KAFKA = "kafka"
DATABASE = "commitline"
_STOP_GRACE_SECONDS = 5.0


def shared_postgres(data_dir: Path) -> SharedServer[EmbeddedPostgres]:
    """The data folder's PostgreSQL. It starts again on the port it had whenever that port is free, so processes
    that stay up across ``commitline down`` / ``up`` (a running ``serve``) reconnect to it by themselves."""
    folder = data_dir.resolve()
    cluster = folder / POSTGRES
    remembered = folder / f"{POSTGRES}.port"

    def start() -> EmbeddedPostgres:
        server = EmbeddedPostgres(cluster, port=_last_port(remembered), database=DATABASE, stop_at_exit=False)
        server.start()
        remembered.write_text(str(server.port))
        return server

    return SharedServer(folder, POSTGRES, Server(
        find=lambda: EmbeddedPostgres.running(cluster, database=DATABASE),
        start=start,
        stop=lambda server: server.stop(),
    ))


class RunningBroker:
    """The data folder's broker as any process sees it: where it listens, which process it is."""

    def __init__(self, port: int, pid: int):
        self.port = port
        self.pid = pid

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


def shared_kafka(data_dir: Path) -> SharedServer[RunningBroker]:
    folder = data_dir.resolve()
    record = folder / f"{KAFKA}.json"

    def find() -> RunningBroker | None:
        try:
            known = json.loads(record.read_text())
            broker = RunningBroker(int(known["port"]), int(known["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return broker if _is_tansu(broker.pid) and listens(broker.port) else None

    def start() -> RunningBroker:
        server = EmbeddedKafka(workdir=folder / KAFKA, stop_at_exit=False)
        server.start()
        assert server.pid is not None
        broker = RunningBroker(server.port, server.pid)
        record.write_text(json.dumps({"port": broker.port, "pid": broker.pid}))
        return broker

    def stop(broker: RunningBroker) -> None:
        try:
            process = psutil.Process(broker.pid)
            process.terminate()
            try:
                process.wait(_STOP_GRACE_SECONDS)
            except psutil.TimeoutExpired:
                process.kill()
        except psutil.NoSuchProcess:
            pass
        record.unlink(missing_ok=True)

    return SharedServer(folder, KAFKA, Server(find=find, start=start, stop=stop))


def _is_tansu(pid: int) -> bool:
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and "tansu" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def _last_port(remembered: Path) -> int | None:
    """The port the server had last time, if it can have it again (None: any free port)."""
    try:
        port = int(remembered.read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 and is_free(port) else None
