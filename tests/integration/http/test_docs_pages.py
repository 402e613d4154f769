"""``/docs`` (Swagger UI) and ``/redoc`` render from this server alone: their pages name no outside host, their
assets come from the installed package, and a real headless browser, which could reach no CDN anyway,
renders the operations of ``/openapi.json``."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.integration.http.conftest import Server
from tests.integration.http.test_status_page import chromium


def test_the_api_documentation_renders_without_the_internet(served: Server, tmp_path: Path) -> None:
    with httpx.Client(base_url=served.base_url, timeout=60) as http:
        for page in ("/docs", "/redoc"):
            html = http.get(page)
            assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
            assert not re.search(r"""(src|href)=["']?(https?:)?//""", html.text), f"{page} loads from another host"
            for asset in re.findall(r"""(?:src|href)=["']?(/docs/static/[\w.-]+)""", html.text):
                assert http.get(asset).status_code == 200, asset
        assert http.get("/docs/static/nope.js").status_code == 404
    dom = chromium(tmp_path, "--dump-dom", f"{served.base_url}/docs").stdout.decode()
    assert "/v1/commands" in dom and "Dispatch one command" in dom, "Swagger UI rendered the API's operations"
