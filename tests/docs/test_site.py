"""The documentation site builds with ``mkdocs build --strict`` (a broken link, anchor or missing page fails), its
reference pages hold what the code says, and the README stays a short entry point into it."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commitline.cli import build_parser
from commitline.framework.loading import load_domain
from commitline.http.app import create_app
from commitline.infrastructure.config import Settings
from commitline.infrastructure.config_brief import brief_markdown
from commitline.infrastructure.metrics import catalogue

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(target)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout[-3000:]}\n{built.stderr[-6000:]}"
    return target


def text_of(site: Path, page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", (site / f"{page}.html").read_text()))


def test_the_readme_is_short_and_links_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024, f"README.md is {len(readme.encode())} bytes: at most 12 KB"
    assert readme.index("make demo") < 600 and "make test" in readme[:1200], "the two commands come first"
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


def test_the_readmes_configuration_table_is_the_codes() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Configuration"):readme.index("## Documentation")]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table == brief_markdown(), ("README.md's configuration table is not the code's: replace it with what "
                                       "`python -m commitline.infrastructure.config_brief` prints")
    assert "(docs/reference/configuration.md)" in section, "the table links to the whole reference"

def test_the_tutorials_complete_example_is_what_commitline_init_writes() -> None:
    tutorial = (ROOT / "docs" / "tutorial.md").read_text()
    section = tutorial[tutorial.index("## One complete example"):]
    shown = section.split("```python\n", 1)[1].split("```", 1)[0]
    written = (ROOT / "commitline" / "scaffold" / "service" / "package" / "refunds.py.tmpl").read_text()
    assert shown == written.replace("${package}", "shelfwise"), "the tutorial shows another refunds.py than init writes"
    lines = shown.splitlines()
    said = f"in {len(lines)} lines ({sum(1 for line in lines if line.strip())} without blank lines)"
    assert said in " ".join(section.split("```python", 1)[0].split()), f"the tutorial should say: {said}"


def test_every_page_is_built_and_none_loads_anything_from_outside(site: Path) -> None:
    pages = sorted(p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md"))
    for page in pages:
        built = site / page.with_suffix(".html")  # the offline plugin: file URLs, pages work from the file system
        assert built.is_file(), f"{page} was not built"
    for built in site.rglob("*.html"):
        external = re.findall(r'(?:src|href)="(https?://[^"]+)"', built.read_text())
        assert not [u for u in external if not u.startswith(("https://github.com", "https://squidfunk"))], \
            (built, external)


def test_the_configuration_reference_lists_every_variable(site: Path) -> None:
    page = text_of(site, "reference/configuration")
    variables = [f.validation_alias or f.alias for f in Settings.model_fields.values()]
    missing = [v for v in variables if isinstance(v, str) and v not in page]
    assert not missing, missing
    assert "COMMITLINE_DATABASE_URL" in page and "KAFKA_BOOTSTRAP_SERVERS" in page


def test_the_cli_reference_shows_every_command(site: Path) -> None:
    page = text_of(site, "reference/cli")
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, parser in commands.items():
        assert f"commitline {name}" in page, name
        assert parser.format_usage().split()[2] in page
    assert "--into-configured-database" in page and "--metrics-port" in page


def test_the_http_reference_is_the_servers_own_description(site: Path) -> None:
    published = orjson.loads((site / "reference" / "openapi.json").read_bytes())
    assert published == create_app(None, domain=load_domain(None)).openapi()
    page = text_of(site, "reference/http-api")
    for path in published["paths"]:
        assert path in page, path
    viewer = (site / "reference" / "api" / "index.html").read_text()
    assert 'src="swagger-ui-bundle.js"' in viewer and "../openapi.json" in viewer
    assert (site / "reference" / "api" / "swagger-ui-bundle.js").stat().st_size > 100_000


def test_the_errors_metrics_and_envelope_references_are_complete(site: Path) -> None:
    errors = text_of(site, "reference/errors")
    for code in ("concurrency_conflict", "invalid_idempotency_key", "store_unavailable", "insufficient_stock",
                 "malformed_json", "duplicate_header"):
        assert code in errors, code
    # each class says what it means itself, not its base class's words, and in Markdown, not reST
    assert errors.count("Base of every error") == 1 and "``" not in errors  # the base class's own row, only
    assert re.search(r"aggregate_not_found\s+AggregateNotFound\s+commitline\.application\.errors\s+No aggregate", errors)
    metrics = text_of(site, "reference/metrics")
    for name, kind, _, _ in catalogue():
        assert (f"{name}_total" if kind == "counter" else name) in metrics, name
    envelope = text_of(site, "reference/kafka-envelope")
    for field in ("event_id", "notification_id", "schema_version", "tenant", "payload"):
        assert field in envelope


def test_the_status_page_screenshot_is_there(site: Path) -> None:
    shot = site / "assets" / "status-page.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "assets/status-page.png" in (site / "operations" / "runbook.html").read_text()
