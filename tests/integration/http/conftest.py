"""``commitline serve`` as a real subprocess on a free loopback port, and API keys made with the real
``commitline tenants add`` (``Server.admin_key``: with ``--admin``); tests talk to it with httpx over TCP.
``server`` is one per test; ``served`` one per module (starting a server costs seconds), on its own schema,
with ``acme``'s client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_env(pg_dsn: str, schema: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema, **extra}


def make_key(env: dict[str, str], tenant: str, *options: str) -> str:
    out = subprocess.run([sys.executable, "-m", "commitline.cli", "tenants", "add", tenant, *options],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@dataclass
class Server:
    """A running ``commitline serve``; ``client(tenant)`` is an httpx client with that tenant's key."""

    base_url: str
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    log: Path
    keys: dict[str, str] = field(default_factory=dict)

    def key(self, tenant: str) -> str:
        if tenant not in self.keys:
            self.keys[tenant] = make_key(self.env, tenant)
        return self.keys[tenant]

    def admin_key(self, tenant: str) -> str:
        """A new administrative key of ``tenant`` (``tenants add --admin``): it may also erase data subjects."""
        return make_key(self.env, tenant, "--admin")

    def client(self, tenant: str | None = None, **options: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.key(tenant)}"} if tenant else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60, **options)  # type: ignore[arg-type]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _answers(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/openapi.json", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def start_server(pg_dsn: str, schema: str, log: Path, *args: str, **env: str) -> Server:
    port = free_port()
    full_env = cli_env(pg_dsn, schema, **env)
    out = log.open("wb")
    process = subprocess.Popen([sys.executable, "-m", "commitline.cli", "serve", "--port", str(port), *args],
                               env=full_env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", full_env, process, log)

    def ready() -> bool:
        assert process.poll() is None, f"commitline serve exited with {process.returncode}:\n{server.output()}"
        return _answers(server.base_url)

    try:
        wait_for(ready, "commitline serve to answer", timeout=120)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture
def server(pg_dsn: str, schema: str, tmp_path: Path) -> Iterator[Server]:
    running = start_server(pg_dsn, schema, tmp_path / "serve.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def module_schema(pg_dsn: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture(scope="module")
def served(pg_dsn: str, module_schema: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(pg_dsn, module_schema, tmp_path_factory.mktemp("serve") / "serve.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def acme(served: Server) -> Iterator[httpx.Client]:
    with served.client("acme") as client:
        yield client
