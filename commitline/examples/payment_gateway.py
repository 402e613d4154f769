"""The payment gateway port: authorize (hold), capture, void, each idempotent per key.

A real adapter implements ``PaymentGateway``; commitline ships a simulated one for tests
and the demo. Authorize-then-capture means no money moves until the order is confirmed,
and voiding an authorization is the compensation for a charge.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Protocol


class GatewayDeclined(Exception):
    """A definite refusal: retrying with the same key gives the same answer."""


class GatewayUnavailable(Exception):
    """A transient failure: nothing happened; retry with the same key."""


class GatewayTimeout(GatewayUnavailable):
    """No answer: it may or may not have happened. Retrying with the same key resolves it."""


class GatewayMisconfigured(Exception):
    """No order's fault: the gateway refused our credentials, or what answered is not the gateway. Nothing is
    undone for it: the saga waits (PARKED) for the configuration to be fixed and ``commitline sagas retry``."""


class PaymentGateway(Protocol):
    def authorize(self, key: str, amount: Decimal, currency: str, account: str) -> str:
        """Hold the amount; return the authorization reference. Raise GatewayDeclined/GatewayUnavailable."""

    def capture(self, key: str) -> str:
        """Take the held amount; idempotent."""

    def void(self, key: str) -> None:
        """Release the hold, or refuse any later authorization under this key if none was made; idempotent."""
