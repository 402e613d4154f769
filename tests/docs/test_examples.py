"""Every shell and Python block of the README and the documentation runs, as written, on the embedded defaults.

Each page runs in a fresh folder (its own ``.commitline`` data folder, so its own embedded PostgreSQL and broker)
that holds this checkout's ``Makefile``, ``pyproject.toml``, package and ``.venv``, with ``commitline`` on PATH and
no ``COMMITLINE_*``, ``KAFKA_*`` or ``OTEL_*`` variable set, as a reader's fresh clone would have (a ``pip install``
goes into that folder, not into the suite's environment). Whatever a page
leaves running (a server started with ``&``, the local services of ``commitline up``) is stopped afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from commitline.framework.loading import load_domain
from commitline.http.app import create_app
from tests.docs.examples import RUNNABLE, Block, blocks, curl_statuses, runnable, script

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINKED = ("Makefile", "pyproject.toml", "commitline", "tools", "docs", "bench", "mkdocs.yml")
SHELL_LOOKING = ("$ ", "commitline ", "curl ", "make ", "python ")
PAGE_SECONDS = 300  # a page's examples take under a minute; a wait in them that never ends fails here
SERVED_AT = 8080  # where the pages' `commitline serve` listens
# A page whose requests answer with errors on purpose says so; on other pages any 4xx answer fails its example.
ERRORS_SHOWN = "<!-- example: shows error answers -->"


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_pages_have_runnable_examples_and_every_exception_says_why() -> None:
    ran = sum(len(runnable(p)) for p in PAGES)
    assert ran >= 30, f"only {ran} runnable blocks found: is the Markdown fence syntax still what examples.py reads?"
    for page in PAGES:
        for block in blocks(page):
            if block.language in RUNNABLE and block.not_run is not None:
                assert len(block.not_run.split()) >= 3, f"{block.where}: say what it needs, not just that it is skipped"
            if not block.language:
                first = block.code.lstrip().split("\n", 1)[0]
                assert not first.startswith(SHELL_LOOKING), (
                    f"{block.where}: a command in a block without a language would never be run; mark it sh or python")


def _check_installed() -> None:
    """The pages run `make demo`: with an install older than pyproject.toml, make would reinstall into the suite's
    own environment from the page's folder (and write that folder into its scripts' first lines)."""
    stamp = Path(sys.executable).parents[1] / ".installed"
    if stamp.exists() and stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.fail("pyproject.toml is newer than the installed environment: run `make test`, which installs first",
                    pytrace=False)


def _workspace(folder: Path) -> None:
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    (folder / ".venv").symlink_to(Path(sys.executable).parents[1])


def _environment(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMITLINE_", "KAFKA_", "OTEL_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    # A page's `pip install` (the tutorial's package) goes into the page's own folder, never into the environment
    # the suite runs in; what it depends on (commitline, pytest) is already there.
    site = folder / "pip-target"
    env.update(PIP_TARGET=str(site), PIP_NO_DEPS="1", PIP_NO_BUILD_ISOLATION="1",
               PYTHONPATH=f"{site}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(site))
    return env


def _stop_everything(process: subprocess.Popen[bytes], folder: Path, env: dict[str, str]) -> None:
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            process.poll()  # reap the page's shell: as a zombie it would keep its process group in existence
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    subprocess.run([sys.executable, "-m", "commitline.cli", "down", "--force"], cwd=folder, env=env,
                   capture_output=True, timeout=120)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=_name)
def test_every_example_of_the_page_runs(page: Path, tmp_path: Path) -> None:
    _check_installed()
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", SERVED_AT)) == 0:
            pytest.fail(f"something already listens on 127.0.0.1:{SERVED_AT}, where the pages' examples serve: stop it",
                        pytrace=False)
    page_blocks: list[Block] = runnable(page)
    _workspace(tmp_path)
    env = _environment(tmp_path)
    (tmp_path / "examples.sh").write_text(script(page_blocks, tmp_path))
    log = tmp_path / "examples.log"
    with log.open("wb") as out:  # a file, not a pipe: a server a page leaves running would hold a pipe open
        process = subprocess.Popen(["bash", str(tmp_path / "examples.sh")], cwd=tmp_path, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=PAGE_SECONDS)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop_everything(process, tmp_path, env)
    text = log.read_text(errors="replace")
    assert not timed_out, f"{_name(page)}: its examples did not finish in {PAGE_SECONDS} s:\n{text[-6000:]}"
    assert process.returncode is not None and process.returncode == 0, (
        f"{_name(page)}: an example failed (exit {process.returncode}):\n{text[-6000:]}")
    assert ">>> every example ran" in text
    routes = _routes()
    shows_errors = ERRORS_SHOWN in page.read_text()
    for status, url in curl_statuses(text):
        assert status < (500 if shows_errors else 400), f"{_name(page)}: {url} answered {status}:\n{text[-4000:]}"
        parts = urlsplit(url)
        if parts.port == SERVED_AT:
            assert any(r.fullmatch(parts.path) for r in routes), f"{_name(page)}: the server has no route {parts.path}"


def _routes() -> list[re.Pattern[str]]:
    """Every path the HTTP API answers (its description's templates, and the routes it does not describe)."""
    described = create_app(None, domain=load_domain(None)).openapi()["paths"]
    templates = [*described, "/", "/docs", "/redoc", "/openapi.json", "/healthz", "/readyz", "/metrics", "/v1/status"]
    return [re.compile(re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(t))) for t in templates]
