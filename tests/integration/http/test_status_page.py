"""The operators' status page at ``/``, rendered by a real headless Chromium against ``commitline serve``.

The store gets known facts first: commands over HTTP, a projection at a known position behind the head,
one stopped at a poison event, a STUCK saga, and a recorded ``commitline audit verify --all``. Then
``/v1/status`` must say exactly that, Chromium's rendered DOM must show it, and the screenshot must show
the key numbers in pixels (read back with Tesseract OCR). Chromium and Tesseract come from the Debian
packages (``make test`` installs them: ``.ci/install-browser``); a browser that does not start fails.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import zlib
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import orjson
import psycopg
import pytest

from commitline.composition import bootstrap
from commitline.infrastructure.kafka.publisher import PUBLISHER
from tests.integration.http.conftest import Server, start_server
from tests.stalling_proxy import StallingProxy
from tests.integration.test_projections import inject_orphan_payment_event
from tests.support import FollowerThread, settings_for, wait_for
from tests.support import configured_gateway, fulfilment_runner, make_saga

CHROMIUM = "/usr/bin/chromium"
TESSERACT = "/usr/bin/tesseract"
WIDTH, HEIGHT = 1280, 1600
INSTALL_HINT = "make test installs it (.ci/install-browser: apt-get install chromium tesseract-ocr)"


def command(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/commands", json=body, headers={"Idempotency-Key": str(uuid4())})
    assert response.status_code in (200, 201), response.text
    return response.json()  # type: ignore[no-any-return]


# -- the browser -------------------------------------------------------------------------------------------------

def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no headless Chromium at {CHROMIUM}: {INSTALL_HINT}", pytrace=False)
    profile = tmp_path / "chromium-profile"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
            "--virtual-time-budget=8000", *args]
    try:
        out = subprocess.run(argv, capture_output=True, timeout=180, env={**os.environ, "HOME": str(tmp_path)})
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"headless Chromium could not run ({' '.join(argv)}): {e}", pytrace=False)
    if out.returncode != 0:
        pytest.fail(f"headless Chromium exited with {out.returncode} ({' '.join(argv)}):\n"
                    f"{out.stderr.decode(errors='replace')[-3000:]}", pytrace=False)
    return out


class Rendered(HTMLParser):
    """The text of every element with an id, and of every element with a class inside one (by id, class)."""

    VOID = {"meta", "link", "br", "img", "input", "hr"}

    def __init__(self, html: str):
        super().__init__()
        self.by_id: dict[str, str] = defaultdict(str)
        self.by_class: dict[tuple[str, str], str] = defaultdict(str)
        self.attrs: dict[str, dict[str, str]] = {}
        self._open: list[tuple[str, str | None, list[str]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if "id" in found:
            self.attrs[found["id"]] = found
        if tag not in self.VOID:
            self._open.append((tag, found.get("id"), found.get("class", "").split()))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        owner = None
        for _, element_id, classes in self._open:
            if element_id is not None:
                self.by_id[element_id] += data
                owner = element_id
            elif owner is not None:
                for cls in classes:
                    self.by_class[(owner, cls)] += data

    def text(self, element_id: str, cls: str | None = None) -> str:
        return (self.by_id[element_id] if cls is None else self.by_class[(element_id, cls)]).strip()


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG whose chunks all check out and whose pixels decompress to that size."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, header, pixels = 8, None, b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"PNG chunk {kind!r} is corrupt"
        if kind == b"IHDR":
            header = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            pixels += body
        at += 12 + length
    assert header is not None, "PNG without a header"
    width, height, depth, color = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    assert len(zlib.decompress(pixels)) == height * (1 + width * channels * depth // 8), "PNG pixels truncated"
    return width, height


def ocr(path: Path) -> str:
    if not os.access(TESSERACT, os.X_OK):
        pytest.fail(f"no Tesseract OCR at {TESSERACT}: {INSTALL_HINT}", pytrace=False)
    out = subprocess.run([TESSERACT, str(path), "stdout"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, f"tesseract failed: {out.stderr[-2000:]}"
    return out.stdout


# -- the test ----------------------------------------------------------------------------------------------------

def test_the_status_page_shows_positions_blocked_projections_stuck_sagas_and_the_last_audit(
        server: Server, pg_dsn: str, schema: str, tmp_path: Path) -> None:
    acme = server.client("acme")
    item = uuid4()
    command(acme, {"type": "receive_stock", "item_id": str(item), "quantity": 5})
    # The simulated gateway declines the capture, then fails to void the authorisation: the saga goes STUCK.
    order = UUID(command(acme, {"type": "place_order", "item_id": str(item), "quantity": 1, "amount": "25.00",
                                "currency": "EUR", "account": "acct|capture-declines|void-fails"})["aggregate_id"])
    for i in range(3):
        command(acme, {"type": "create_survey_task", "title": f"task {i}"})

    with bootstrap(settings_for(pg_dsn, schema)) as app:
        saga = make_saga(app, configured_gateway(app), backoff=0.01)
        with FollowerThread(lambda: fulfilment_runner(app, saga, poll_interval=0.1)) as runner, \
                FollowerThread(lambda: app.projector("order_fulfilments", poll_interval=0.1)):
            wait_for(lambda: app.read_models().fulfilments(stuck_only=True), "the order's saga to be STUCK", 120)
            wait_for(lambda: runner.follower.metrics.position >= app.recorder.max_notification_id(),
                     "the saga runner to reach the head")
        poison_at = inject_orphan_payment_event(app)
        with FollowerThread(lambda: app.projector("payment_states", poll_interval=0.1)) as payments:
            wait_for(lambda: payments.follower.metrics.poisoned_at is not None, "payment_states to meet the poison")
        projected = app.recorder.max_notification_id()
        with FollowerThread(lambda: app.projector("task_statuses", poll_interval=0.1)) as tasks:
            tasks.wait_until_at(projected)
    for i in range(2):  # task_statuses is left 2 events behind
        command(acme, {"type": "create_survey_task", "title": f"later {i}"})
    head = projected + 2

    verified = subprocess.run([sys.executable, "-m", "commitline.cli", "audit", "verify", "--all", "--json"],
                              env=server.env, capture_output=True, timeout=120)
    assert verified.returncode == 0, verified.stderr.decode(errors="replace")
    audit = orjson.loads(verified.stdout)
    assert audit["ok"] and audit["streams"] >= 6 and audit["events"] == head

    # /v1/status: no key needed, the facts as stored.
    anonymous = httpx.Client(base_url=server.base_url, timeout=60)
    response = anonymous.get("/v1/status")
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    status = response.json()
    followers = {f["name"]: f for f in status["followers"]}
    assert status["head"] == head and not status["healthy"]
    assert (followers["task_statuses"]["position"], followers["task_statuses"]["lag_events"]) == (projected, 2)
    assert followers["task_statuses"]["status"] == "stopped" and not followers["task_statuses"]["alive"]
    assert followers["payment_states"]["status"] == "failed"
    assert followers["payment_states"]["position"] == poison_at - 1
    assert followers[PUBLISHER]["status"] == "never run"
    (blocked,) = status["blocked"]
    assert (blocked["name"], blocked["poison_position"], blocked["event_type"]) == (
        "payment_states", poison_at, "PaymentSubmitted")
    assert blocked["commands"] == ["commitline projections retry payment_states",
                                   f'commitline projections skip payment_states --position {poison_at} '
                                   '--reason "<why it is safe>"']
    (stuck,) = status["stuck_fulfilments"]
    assert (stuck["order_id"], stuck["tenant"], stuck["state"]) == (str(order), "acme", "STUCK")
    assert stuck["reason"].startswith("charge: GatewayUnavailable")
    assert stuck["command"] == f"commitline sagas retry {order} --tenant acme"
    last = status["audit"]["last"]
    assert (last["ok"], last["scope"], last["streams"], last["events"], last["broken"]) == (
        True, "all", audit["streams"], audit["events"], 0)
    assert status["audit"]["last_all"] == last

    page = anonymous.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "http://" not in page.text and "https://" not in page.text, "the page must load nothing external"
    for asset in ("/static/status.js", "/static/status.css"):
        assert anonymous.get(asset).status_code == 200
    missing = anonymous.get("/static/nope.js")
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"

    # What a browser renders from it.
    dom = Rendered(chromium(tmp_path, "--dump-dom", f"{server.base_url}/").stdout.decode())
    assert dom.attrs["refresh"].get("class") == "muted", f"the page did not load /v1/status: {dom.text('refresh')}"
    assert dom.text("head") == str(head)
    assert dom.text("follower-task_statuses", "position") == str(projected)
    assert dom.text("follower-task_statuses", "lag-events") == "2"
    lag = followers["task_statuses"]["lag_seconds"]  # the age of its oldest unhandled event, shown as time
    assert re.fullmatch(r"\d+\.\d s|\d+ min", dom.text("follower-task_statuses", "lag-seconds")), lag
    assert dom.text("follower-task_statuses", "status") == "stopped"
    assert dom.text("follower-payment_states", "position") == str(poison_at - 1)
    assert dom.text("follower-payment_states", "status") == "failed"
    assert dom.text("blocked-count") == "1" and dom.text("stuck-count") == "1"
    assert dom.text("blocked-payment_states", "poison-position") == str(poison_at)
    assert f"commitline projections skip payment_states --position {poison_at}" in dom.text("blocked")
    assert (dom.text(f"stuck-{order}", "tenant"), dom.text(f"stuck-{order}", "state")) == ("acme", "STUCK")
    assert dom.text(f"stuck-{order}", "command") == f"commitline sagas retry {order} --tenant acme"
    assert dom.text("audit-verdict") == "OK"
    assert dom.text("audit", "audit-streams") == str(audit["streams"])
    assert dom.text("audit", "audit-events") == str(audit["events"])
    assert dom.text("audit", "audit-scope") == "every stream"

    # ...and what it shows in pixels.
    shot = tmp_path / "status.png"
    chromium(tmp_path, f"--screenshot={shot}", f"{server.base_url}/")
    assert png_size(shot) == (WIDTH, HEIGHT)
    text = ocr(shot)
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    assert lines, "OCR read nothing: the screenshot is blank"
    where = f"in the screenshot's OCR text:\n{text}"
    label = next((i for i, line in enumerate(lines) if "LOG HEAD" in line.upper()), None)
    assert label is not None, f"no 'LOG HEAD' {where}"
    assert lines[label + 1].split()[0] == str(head), f"log head {head} not under its label {where}"
    row = next((line for line in lines if re.match(r"task.statuses\b", line)), None)
    assert row is not None, f"no task_statuses row {where}"
    assert re.search(rf"\b{projected}\b \b2\b", row), f"task_statuses' position {projected} and lag 2 not {where}"
    assert re.search(rf"\b{poison_at}\b", " ".join(line for line in lines if "poison" in line)), \
        f"poison position {poison_at} not {where}"
    # The audit block is label and value on one line, or (as Tesseract sometimes segments the table) the labels
    # in one column and the values in the next: then each count stands on a line of its own after the labels.
    audit_at = next((i for i, line in enumerate(lines) if line.lower().startswith("last audit")), 0)

    def shown(label: str, value: int) -> bool:
        if any(re.fullmatch(rf"{label},? {value}", line) for line in lines):
            return True
        labelled = next((i for i, line in enumerate(lines) if i > audit_at and line == label), None)
        return labelled is not None and str(value) in lines[labelled + 1:]

    assert shown("streams", audit["streams"]), f"audit streams not {where}"
    assert shown("events", audit["events"]), f"audit events not {where}"


def test_the_last_recorded_verification_is_shown_broken_and_scoped_as_run(
        server: Server, pg_dsn: str, schema: str, tmp_path: Path) -> None:
    anonymous = httpx.Client(base_url=server.base_url, timeout=60)
    fresh = anonymous.get("/v1/status").json()
    assert (fresh["head"], fresh["healthy"], fresh["blocked"], fresh["stuck_fulfilments"]) == (0, True, [], [])
    assert fresh["audit"] == {"last": None, "last_all": None}

    acme = server.client("acme")
    payment = command(acme, {"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "a"})
    target = payment["aggregate_id"]
    command(acme, {"type": "submit_payment", "payment_id": target})
    command(acme, {"type": "create_survey_task", "title": "bystander"})

    def verify(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "commitline.cli", "audit", "verify", *args], env=server.env,
                              capture_output=True, timeout=120)

    assert verify("--all").returncode == 0
    full = anonymous.get("/v1/status").json()["audit"]["last"]
    assert (full["ok"], full["scope"], full["streams"], full["events"], full["broken"]) == (True, "all", 2, 3, 0)
    assert (full["aggregate_id"], full["tenant"]) == (None, None)
    unknown = verify("--aggregate", str(uuid4()), "--tenant", "acme")
    assert unknown.returncode == 2, unknown.stderr
    assert anonymous.get("/v1/status").json()["audit"]["last"] == full, "a failed lookup is no verification"

    with psycopg.connect(pg_dsn) as conn:  # a superuser working around the append-only trigger
        conn.execute("SET session_replication_role = replica")
        conn.execute(f'DELETE FROM "{schema}".events WHERE originator_id = %s AND originator_version = 1', (target,))
    assert verify("--aggregate", target, "--tenant", "acme").returncode == 1
    audit = anonymous.get("/v1/status").json()["audit"]
    one = audit["last"]
    assert (one["ok"], one["scope"], one["aggregate_id"], one["tenant"], one["streams"], one["broken"]) == (
        False, "aggregate", target, "acme", 1, 1)
    assert audit["last_all"] == full

    dom = Rendered(chromium(tmp_path, "--dump-dom", f"{server.base_url}/").stdout.decode())
    assert dom.text("audit-verdict") == "BROKEN"
    assert dom.text("audit", "audit-scope") == f"aggregate {target} (tenant acme)"
    assert dom.text("audit", "audit-broken") == "1"
    assert dom.text("audit", "audit-full").startswith("OK, 2 streams, 3 events")

    assert verify("--all").returncode == 1
    audit = anonymous.get("/v1/status").json()["audit"]
    assert (audit["last"]["ok"], audit["last"]["scope"], audit["last"]["broken"]) == (False, "all", 1)
    assert audit["last_all"] == audit["last"]


def test_while_the_database_is_down_the_page_says_its_health_is_unknown_not_the_last_verdict(
        pg_dsn: str, schema: str, tmp_path: Path) -> None:
    """Once the page cannot refresh (here: the database refuses connections, so ``/v1/status`` answers 503), it
    does not go on showing a green "healthy": health reads "unknown", the figures are greyed as the last known,
    and the line above says why in the page's own words, not a command caller's advice."""
    proxy = StallingProxy(pg_dsn)
    server = start_server(proxy.dsn, schema, tmp_path / "serve.log")
    try:
        healthy = Rendered(chromium(tmp_path, "--dump-dom", f"{server.base_url}/").stdout.decode())
        assert healthy.text("health") == "healthy" and healthy.attrs["refresh"].get("class") == "muted"
        proxy.close()  # every connection ends; new ones are refused
        wait_for(lambda: httpx.get(f"{server.base_url}/v1/status", timeout=30).status_code == 503,
                 "/v1/status to answer 503 with the database gone")
        down = Rendered(chromium(tmp_path, "--dump-dom", f"{server.base_url}/").stdout.decode())
        assert down.text("health") == "unknown", down.text("health")
        assert down.attrs["refresh"].get("class") == "bad"
        assert "cannot refresh (the database does not answer)" in down.text("refresh"), down.text("refresh")
        assert "retry with the same key" not in down.text("refresh")
    finally:
        server.stop()
        proxy.close()
