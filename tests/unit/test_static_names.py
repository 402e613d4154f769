"""Every name the code uses is defined: ruff's pyflakes checks (undefined names, names redefined before use,
literal comparisons by identity, repeated dict keys) over the product, the benches, the tools and the tests.

A path that no test happens to run (a refusal, an error branch) fails here instead of with a ``NameError`` in
front of an operator. Unused imports are not checked: packages re-export by importing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
CHECKS = "F821,F822,F823,F811,F632,F601,F602"
TREES = ("commitline", "bench", "tools", "tests")


def ruff(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", CHECKS,
                           "--output-format", "concise", *TREES], cwd=root, capture_output=True, text=True,
                          timeout=120)


def test_every_name_the_code_uses_is_defined() -> None:
    done = ruff(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_an_undefined_name_on_a_path_no_test_runs_is_found(tmp_path: Path) -> None:
    for tree in TREES:
        shutil.copytree(ROOT / tree, tmp_path / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    module = tmp_path / "commitline" / "cli" / "projections.py"
    module.write_text(module.read_text() + "\n\ndef _never_called() -> int:\n    return EXIT_SOMETIMES\n")
    done = ruff(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "projections.py" in done.stdout and "F821 Undefined name `EXIT_SOMETIMES`" in done.stdout
