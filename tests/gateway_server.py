"""A small payment gateway speaking ``HttpGateway``'s contract, served on loopback for the tests.

It keeps a ledger in memory, answers each ``Idempotency-Key`` with its first outcome, and misbehaves by
tokens in the account, ``|``-separated: ``declines`` (402), ``unavailable`` (503 always),
``fails-once`` (503 on the first authorize), ``slow-once`` (the first authorize holds the amount, then
answers only after ``slow_s`` seconds), ``capture-lost`` (a capture takes the money, then answers 500 while
``capture_lost`` is True: the answer a client never gets), ``not-a-gateway`` (every call answered 200 with a web
page, as a server that is not the gateway would), ``trickle`` (the authorize's answer sent a byte at a time,
``trickle_s`` apart). ``calls`` counts requests per (operation, payment key).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class GatewayServer:
    def __init__(self, token: str | None = None, slow_s: float = 2.0, trickle_s: float = 0.3):
        self.token = token
        self.slow_s = slow_s
        self.trickle_s = trickle_s
        self.capture_lost = True
        self.ledger: dict[str, dict[str, Any]] = {}
        self.answers: dict[str, tuple[int, dict[str, Any]]] = {}
        self.calls: Counter[tuple[str, str]] = Counter()
        self.accounts: dict[str, str] = {}  # payment key -> the account its first authorize named
        self.headers_seen: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> GatewayServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _decide(self, operation: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        key = body["payment_key"]
        with self.lock:
            self.calls[(operation, key)] += 1
            call = self.calls[(operation, key)]
            entry = self.ledger.get(key)
            account = self.accounts.setdefault(key, body.get("account", ""))
            tokens = set(account.split("|"))
            if "unavailable" in tokens:
                return 503, {"detail": "gateway down for maintenance"}, 0
            if "not-a-gateway" in tokens:
                return 200, {"html": "<html>Welcome</html>"}, 0
            if operation == "authorize":
                if entry is not None:
                    return (402, {"detail": "voided"}, 0) if entry["status"] == "VOIDED" else (
                        200, {"reference": f"auth-{key}"}, 0)
                if "declines" in tokens:
                    return 402, {"detail": "card declined"}, 0
                if "fails-once" in tokens and call == 1:
                    return 503, {"detail": "try again"}, 0
                self.ledger[key] = {"status": "AUTHORIZED", "amount": body["amount"], "account": body["account"],
                                    "captures": 0}
                return 200, {"reference": f"auth-{key}"}, self.slow_s if "slow-once" in tokens and call == 1 else 0
            if operation == "capture":
                if entry is None or entry["status"] == "VOIDED":
                    return 402, {"detail": "nothing authorized"}, 0
                if entry["status"] == "AUTHORIZED":
                    entry["status"], entry["captures"] = "CAPTURED", entry["captures"] + 1
                if "capture-lost" in tokens and self.capture_lost:
                    return 500, {"detail": "internal error after the capture"}, 0
                return 200, {"reference": f"capture-{key}"}, 0
            if operation == "void":
                if entry is None:
                    self.ledger[key] = {"status": "VOIDED", "account": "", "captures": 0}
                elif entry["status"] == "CAPTURED":
                    return 409, {"detail": "captured: cannot void"}, 0
                else:
                    entry["status"] = "VOIDED"
                return 200, {}, 0
            return 404, {"detail": f"no operation {operation}"}, 0

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                server.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                    status, answer, delay = 401, {"detail": "bad token"}, 0.0
                else:
                    status, answer, delay = server._decide(self.path.strip("/"), body)
                time.sleep(delay)
                tokens = set(server.accounts.get(body.get("payment_key", ""), "").split("|"))
                data = answer["html"].encode() if "html" in answer else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html" if "html" in answer else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    if "trickle" in tokens and self.path.strip("/") == "authorize":
                        for i in range(len(data)):
                            self.wfile.write(data[i:i + 1])
                            self.wfile.flush()
                            time.sleep(server.trickle_s)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout the test provoked)

        return Handler


class NotAGateway:
    def authorize(self) -> None:
        pass


def factory(context: Any) -> Any:
    """A ``COMMITLINE_GATEWAY=module:factory`` factory: the HTTP adapter to a URL of the test's choosing."""
    from commitline.examples.http_gateway import HttpGateway

    return HttpGateway(context.settings.gateway_url, timeout_s=context.settings.gateway_timeout_s)


def not_a_gateway(context: Any) -> NotAGateway:
    return NotAGateway()
