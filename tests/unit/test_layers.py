"""The layers hold: imports point down (domain <- application <- infrastructure <- projections <- framework <-
composition <- http <- cli), the engine imports no example, the examples use the public API only, and no core
module names an example's aggregate. Checked with import-linter over the real source, and shown to fail on a
copy of the source with one upward import added."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
PUBLIC = {"commitline", "commitline.testing"}
CORE = ("application", "infrastructure", "http", "cli", "projections", "framework", "domain")
EXAMPLE_NAMES = ("PaymentTransaction", "InventoryItem", "SurveyTask", "SurveyAssignment", "OrderFulfilment")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(root), "PATH": ""})


def test_the_import_contracts_are_kept() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 kept, 0 broken" in done.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "commitline", tmp_path / "commitline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    processor = tmp_path / "commitline" / "application" / "processor.py"
    processor.write_text(processor.read_text() + "\nfrom commitline.examples.payments import PaymentTransaction\n"
                         "from commitline.composition import bootstrap\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "imports point down the layers BROKEN" in done.stdout
    assert "commitline.application is not allowed to import commitline.composition" in done.stdout
    assert "the engine knows no domain: nothing of commitline imports the examples BROKEN" in done.stdout


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0]
    return found + [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]


def test_the_examples_use_only_the_public_api() -> None:
    private = {(str(path.relative_to(ROOT)), module) for path in (ROOT / "commitline" / "examples").glob("*.py")
               for module in _imports(path) if module.startswith("commitline")
               and module not in PUBLIC and not module.startswith("commitline.examples")}
    assert private == set(), "examples import commitline's internals: use `from commitline import ...`"


def test_no_core_module_names_an_example_aggregate() -> None:
    named = [(str(path.relative_to(ROOT)), name) for part in CORE for path in (ROOT / "commitline" / part).rglob("*.py")
             for name in EXAMPLE_NAMES if name in path.read_text()]
    assert named == []
