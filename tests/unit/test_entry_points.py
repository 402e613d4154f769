"""The entry points only ask the composition root: no module of the CLI or the HTTP server imports the
infrastructure, the projections, the framework or a database driver, and importing the CLI (and the
composition root's light part, ``setup``) loads no metrics client, so ``commitline serve`` can still choose
how ``prometheus_client`` counts before its first import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
BELOW = ("commitline.infrastructure", "commitline.projections", "commitline.framework", "psycopg")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0]
    return found + [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]


@pytest.mark.parametrize("package", ["cli", "http"])
def test_entry_points_import_only_the_composition_root_and_application_names(package: str) -> None:
    below = sorted((path.name, module) for path in (ROOT / "commitline" / package).glob("*.py")
                   for module in _imports(path) if module.startswith(BELOW))
    assert below == []


def test_importing_the_cli_loads_no_metrics_client() -> None:
    code = ("import sys, commitline.cli, commitline.composition.setup; "
            "print(sorted(m for m in sys.modules if m.startswith(('prometheus_client', 'commitline.composition.root'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_log_level_and_app_are_options_of_every_command_before_or_after_it() -> None:
    from commitline.cli import take_app, take_option

    assert take_option(["status", "--log-level", "INFO", "--check"], "--log-level") == ("INFO", ["status", "--check"])
    assert take_option(["--log-level=DEBUG", "status"], "--log-level") == ("DEBUG", ["status"])
    assert take_app(["dispatch", "--app", "shop:domain", "-k", "k", "{}"]) == ("shop:domain", ["dispatch", "-k", "k",
                                                                                                "{}"])
    assert take_option(["dispatch", "--", "--log-level", "x"], "--log-level") == (None, ["dispatch", "--",
                                                                                         "--log-level", "x"])
