"""The documentation's screenshot of the status page, taken from a real ``commitline serve`` in headless Chromium.

``make screenshot`` runs it: a temporary data folder with its own embedded PostgreSQL and broker, a tenant, a
few hundred commands of the example domain over HTTP, the publisher and the projections run to the head, one
order fulfilment left waiting for a person, an audit verification, then the page captured as a PNG.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

CHROMIUM = "/usr/bin/chromium"
WIDTH, HEIGHT = 1280, 1500


def _run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "commitline.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"commitline {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _commands(base: str, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        def send(body: dict[str, object]) -> dict[str, object]:
            answer = client.post("/v1/commands", json=body, headers={"Idempotency-Key": str(uuid.uuid4())})
            answer.raise_for_status()
            return answer.json()  # type: ignore[no-any-return]

        for n in range(120):
            payment = send({"type": "create_payment", "amount": f"{10 + n}.50", "currency": "EUR", "account": f"a{n}"})
            send({"type": "submit_payment", "payment_id": payment["aggregate_id"]})
        item = str(uuid.uuid4())
        send({"type": "receive_stock", "item_id": item, "quantity": 500})
        for _ in range(40):
            send({"type": "reserve_stock", "item_id": item, "quantity": 1, "reservation_id": str(uuid.uuid4())})
        # an order whose item has no stock: its fulfilment cannot reserve and waits for a person
        send({"type": "place_order", "item_id": str(uuid.uuid4()), "quantity": 3, "amount": "30.00",
              "currency": "EUR", "account": "shop-1"})


def _caught_up(env: dict[str, str]) -> None:
    """Wait until every follower that runs has handled the whole log (at most two minutes)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        report = json.loads(_run(env, "status", "--json"))
        running = [f for f in report["followers"] if f["alive"]]
        if len(running) >= 2 and all(f["lag_events"] == 0 for f in running):
            return
        time.sleep(0.5)
    raise SystemExit("the projections and the saga runner did not reach the log head in 120 s")


def main(target: Path) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"no headless Chromium at {CHROMIUM}: run `make browser` first")
    folder = Path(tempfile.mkdtemp(prefix="commitline-screenshot-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMITLINE_", "KAFKA_"))}
    env.update(COMMITLINE_DATA_DIR=str(folder / "data"), COMMITLINE_LOG_LEVEL="WARNING")
    port = _free_port()
    server = None
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        _run(env, "up")
        key = _run(env, "tenants", "add", "acme").strip()
        server = subprocess.Popen([sys.executable, "-m", "commitline.cli", "serve", "--port", str(port)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("commitline serve did not become ready in 120 s")
            time.sleep(0.2)
        for follower in (["project"], ["sagas", "run"]):
            helpers.append(subprocess.Popen([sys.executable, "-m", "commitline.cli", *follower], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True))
        _commands(base, key)
        _run(env, "publish", "--drain")
        _caught_up(env)
        _run(env, "audit", "verify", "--all")
        profile = folder / "chromium"
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
                        f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=8000",
                        f"--screenshot={target.resolve()}", f"{base}/"],
                       check=True, capture_output=True, timeout=180, env={**env, "HOME": str(folder)})
        print(f"{target}: the status page of a real commitline serve, {WIDTH}x{HEIGHT}")
    finally:
        for process in [*helpers, *([server] if server is not None else [])]:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
        subprocess.run([sys.executable, "-m", "commitline.cli", "down", "--force"], env=env, capture_output=True,
                       timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/assets/status-page.png"))
