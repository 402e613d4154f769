"""``HttpGateway``: the ``PaymentGateway`` port over HTTP (``COMMITLINE_GATEWAY=http``).

The contract a payment service (or a small bridge in front of one) implements, under ``COMMITLINE_GATEWAY_URL``:

    POST /authorize  {"payment_key", "amount" (decimal string), "currency", "account"} -> {"reference": "..."}
    POST /capture    {"payment_key"}                                               -> {"reference": "..."}
    POST /void       {"payment_key"}                                               -> 2xx

Each request carries ``Idempotency-Key: <operation>/<payment_key>``, so a retried call is the same call,
and ``Authorization: Bearer <COMMITLINE_GATEWAY_TOKEN>`` when a token is configured (else Basic credentials when the
URL has a user and password). Answers:
2xx done (for authorize and capture, only with a JSON object holding the ``reference``); 402, 409 or 422 a definite
refusal (``GatewayDeclined``, with the body's ``detail`` or ``title``); 401 or 403, or a 2xx without the reference
that authorize and capture answer, ``GatewayMisconfigured`` (the credentials, or a URL that is not the gateway's);
anything else, or no connection, ``GatewayUnavailable`` (retried); no whole answer within
``COMMITLINE_GATEWAY_TIMEOUT_S`` of sending (the whole call, however slowly the answer trickles in),
``GatewayTimeout`` (it may have happened: retried under the same key, which the gateway answers with the first
outcome).
"""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import httpx

from commitline import ConfigurationError
from commitline.examples.payment_gateway import (GatewayDeclined, GatewayMisconfigured, GatewayTimeout,
                                                 GatewayUnavailable)

DECLINED = frozenset({402, 409, 422})
CREDENTIALS_REFUSED = frozenset({401, 403})
REFERENCED = frozenset({"authorize", "capture"})  # the operations whose answer holds the gateway's reference


def printable(value: object, limit: int) -> str:
    """``value`` safe to show: printable text as it is, anything else as its ``repr``; at most ``limit`` characters."""
    text = value if isinstance(value, str) and value.isprintable() else repr(value)
    return text[:limit] + ("..." if len(text) > limit else "")


class HttpGateway:
    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 10,
                 transport: httpx.BaseTransport | None = None):
        if token is not None and not (token.isascii() and token.isprintable() and " " not in token and token):
            # a header cannot carry it: every call would fail as if the gateway had dropped the connection
            raise ConfigurationError("COMMITLINE_GATEWAY_TOKEN", "holds characters an HTTP header cannot carry "
                                     "(a space, a line break such as a file's last newline, or a non-ASCII "
                                     "character): give the token alone")
        self.timeout_s = timeout_s
        url = httpx.URL(base_url.rstrip("/"))
        # A user and password in the URL are sent as Basic credentials, unless a token is configured: then the
        # token alone (httpx would otherwise replace the Bearer header with them). Either way they leave the URL,
        # so that no log line or error naming it shows them.
        auth = httpx.BasicAuth(url.username, url.password) if url.userinfo and not token else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=url.copy_with(userinfo=b""), headers=headers, auth=auth,
                                   timeout=timeout_s, transport=transport)

    def authorize(self, key: str, amount: Decimal, currency: str, account: str) -> str:
        return self._call("authorize", key, amount=str(amount), currency=currency, account=account)

    def capture(self, key: str) -> str:
        return self._call("capture", key)

    def void(self, key: str) -> None:
        self._call("void", key)

    def close(self) -> None:
        self.client.close()

    def _call(self, operation: str, key: str, **fields: Any) -> str:
        deadline = time.monotonic() + self.timeout_s
        try:
            with self.client.stream("POST", f"/{operation}", json={"payment_key": key, **fields},
                                    headers={"Idempotency-Key": f"{operation}/{key}"}) as response:
                chunks = []
                for chunk in response.iter_bytes():  # each read is bounded by the client's timeout; the whole, here
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise GatewayTimeout(f"{operation}: no whole answer within {self.timeout_s} s")
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
            raise GatewayUnavailable(f"{operation}: cannot reach the gateway ({type(e).__name__})") from None
        except httpx.TimeoutException:
            raise GatewayTimeout(f"{operation}: no answer within {self.timeout_s} s") from None
        except httpx.TransportError as e:  # sent, then the connection broke: the outcome is unknown
            raise GatewayTimeout(f"{operation}: connection lost before the answer ({type(e).__name__})") from None
        status, body = response.status_code, self._json(b"".join(chunks))
        if 200 <= status < 300:
            reference = body.get("reference")
            if operation not in REFERENCED:
                return ""
            if isinstance(reference, str) and reference:
                return reference
            raise GatewayMisconfigured(f"{operation}: HTTP {status} without a reference: not the gateway's answer "
                                       "(is COMMITLINE_GATEWAY_URL the gateway?)")
        reason = self._reason(status, body)
        if status in DECLINED:
            raise GatewayDeclined(reason)
        if status in CREDENTIALS_REFUSED:
            raise GatewayMisconfigured(f"{operation}: {reason}: the gateway refused the credentials "
                                       "(COMMITLINE_GATEWAY_TOKEN, or the user and password in the URL)")
        raise GatewayUnavailable(f"{operation}: {reason}")

    @staticmethod
    def _json(content: bytes) -> dict[str, Any]:
        try:
            body = json.loads(content)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    @staticmethod
    def _reason(status: int, body: dict[str, Any]) -> str:
        said = body.get("detail") or body.get("title") or body.get("reason")
        return f"HTTP {status}" + (f": {printable(said, 200)}" if said else "")


def create(context: Any) -> HttpGateway:
    """The ``COMMITLINE_GATEWAY=http`` factory (``gateways.py``)."""
    settings = context.settings
    token = settings.gateway_token.get_secret_value() if settings.gateway_token else None
    return HttpGateway(settings.gateway_url, token=token, timeout_s=settings.gateway_timeout_s)
