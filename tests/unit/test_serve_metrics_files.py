"""``serve --workers N`` keeps its workers' metrics in a directory of its own, named with its pid; one left by a
serve killed before it could remove it (kill -9) is removed by the next serve, and one of a running serve is
not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from commitline.cli.serve import METRICS_PREFIX, MULTIPROC_DIR, metrics_files


def test_a_serve_removes_the_metrics_files_a_killed_one_left_and_keeps_a_running_ones() -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = Path(tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{int(gone.stdout)}-"))
    (stale / "counter_1.db").write_bytes(b"left over")
    running = Path(tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{os.getppid()}-"))
    try:
        with metrics_files(2):
            mine = Path(os.environ[MULTIPROC_DIR])
            assert mine.is_dir() and mine.name.startswith(f"{METRICS_PREFIX}{os.getpid()}-")
            assert not stale.exists() and running.is_dir()
        assert not mine.exists()
    finally:
        os.environ.pop(MULTIPROC_DIR, None)
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(running, ignore_errors=True)
