"""The API fuzzed from its own description: schemathesis (its command line, as a separate process) reads
``/openapi.json`` of a real ``commitline serve`` and sends thousands of generated requests, valid and
invalid, over TCP. Every check it has must pass (no 5xx; every status, header, content type and body as
documented; schema-valid requests accepted, schema-invalid ones refused; a missing or wrong API key
refused; 405 with ``Allow``), and ours (``tests/fuzz/hooks.py``): every error is a problem document, and
an error wrote nothing to the store.

``COMMITLINE_FUZZ_EXAMPLES`` (default 60 per operation and phase) and ``COMMITLINE_FUZZ_SEED`` (default
fixed, so a run is repeatable) size it; ``make fuzz`` runs a longer one with a fresh seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.http.conftest import Server

ROOT = Path(__file__).parents[3]
CONFIG = ROOT / "tests" / "fuzz" / "schemathesis.toml"


@pytest.mark.timeout(3600)  # `make fuzz` runs it longer
def test_every_request_generated_from_the_description_is_answered_as_described(
        server: Server, pg_dsn: str, schema: str) -> None:
    description = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    assert description["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    examples = os.environ.get("COMMITLINE_FUZZ_EXAMPLES", "60")
    seed = os.environ.get("COMMITLINE_FUZZ_SEED", "20261124")
    # An administrative key: it may call every route, erasures included (an ordinary one is refused there, 403).
    env = {**os.environ, "COMMITLINE_FUZZ_API_KEY": server.admin_key("acme"), "SCHEMATHESIS_HOOKS": "tests.fuzz.hooks",
           "COMMITLINE_FUZZ_DATABASE_URL": pg_dsn, "COMMITLINE_FUZZ_SCHEMA": schema,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(CONFIG), "run",
            f"{server.base_url}/openapi.json", "--max-examples", examples, "--workers", "1"]
    if seed != "random":
        argv += ["--seed", seed]
    run = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3500)
    report = run.stdout[-12000:] + run.stderr[-3000:]
    assert run.returncode == 0, f"schemathesis found what the description does not say:\n{report}"
    assert " passed" in run.stdout and "generated" in run.stdout, report
    assert "Internal Server Error" not in server.output(), server.output()[-5000:]
