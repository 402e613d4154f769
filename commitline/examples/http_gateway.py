"""``HttpGateway``: the ``PaymentGateway`` port over HTTP (``COMMITLINE_GATEWAY=http``).

The contract a payment service (or a small bridge in front of one) implements, under ``COMMITLINE_GATEWAY_URL``:

    POST /authorize  {"payment_key", "amount" (decimal string), "currency", "account"} -> {"reference": "..."}
    POST /capture    {"payment_key"}                                               -> {"reference": "..."}
    POST /void       {"payment_key"}                                               -> 2xx

Each request carries ``Idempotency-Key: <operation>/<payment_key>``, so a retried call is the same call,
and ``Authorization: Bearer <COMMITLINE_GATEWAY_TOKEN>`` when a token is configured (else Basic credentials when the
URL has a user and password). Answers:
2xx done; 402, 409 or 422 a definite refusal (``GatewayDeclined``, with the body's ``detail`` or ``title``);
anything else, or no connection, ``GatewayUnavailable`` (nothing happened as far as we know: retried);
no answer within ``COMMITLINE_GATEWAY_TIMEOUT_S`` after sending, ``GatewayTimeout`` (it may have happened:
retried under the same key, which the gateway answers with the first outcome).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx

from commitline.examples.payment_gateway import GatewayDeclined, GatewayTimeout, GatewayUnavailable

DECLINED = frozenset({402, 409, 422})


def printable(value: object, limit: int) -> str:
    """``value`` safe to show: printable text as it is, anything else as its ``repr``; at most ``limit`` characters."""
    text = value if isinstance(value, str) and value.isprintable() else repr(value)
    return text[:limit] + ("..." if len(text) > limit else "")


class HttpGateway:
    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 10,
                 transport: httpx.BaseTransport | None = None):
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
        try:
            response = self.client.post(f"/{operation}", json={"payment_key": key, **fields},
                                        headers={"Idempotency-Key": f"{operation}/{key}"})
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
            raise GatewayUnavailable(f"{operation}: cannot reach the gateway ({type(e).__name__})") from None
        except httpx.TimeoutException:
            raise GatewayTimeout(f"{operation}: no answer within {self.client.timeout.read} s") from None
        except httpx.TransportError as e:  # sent, then the connection broke: the outcome is unknown
            raise GatewayTimeout(f"{operation}: connection lost before the answer ({type(e).__name__})") from None
        if response.is_success:
            return str(self._json(response).get("reference", ""))
        reason = self._reason(response)
        if response.status_code in DECLINED:
            raise GatewayDeclined(reason)
        raise GatewayUnavailable(f"{operation}: {reason}")

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def _reason(self, response: httpx.Response) -> str:
        body = self._json(response)
        said = body.get("detail") or body.get("title") or body.get("reason")
        return f"HTTP {response.status_code}" + (f": {printable(said, 200)}" if said else "")


def create(context: Any) -> HttpGateway:
    """The ``COMMITLINE_GATEWAY=http`` factory (``gateways.py``)."""
    settings = context.settings
    token = settings.gateway_token.get_secret_value() if settings.gateway_token else None
    return HttpGateway(settings.gateway_url, token=token, timeout_s=settings.gateway_timeout_s)
