"""The ``payments`` port's factory: which payment gateway the fulfilment saga calls, chosen by
``COMMITLINE_GATEWAY``.

``simulated`` (the default: the demo's gateway, its ledger in PostgreSQL), ``http`` (``HttpGateway``, the
HTTP adapter to ``COMMITLINE_GATEWAY_URL``) or ``module:factory``: an import path of a function that takes
a ``PortContext`` and returns a ``PaymentGateway`` (authorize, capture, void, each idempotent per key).
A path that cannot be imported or called, or that returns something without those methods, is a
``ConfigurationError`` naming ``COMMITLINE_GATEWAY``, raised when the saga is built, not at the first order.
"""

from __future__ import annotations

import importlib
from typing import Any

from commitline import ConfigurationError, PortContext
from commitline.examples.payment_gateway import PaymentGateway

OPERATIONS = ("authorize", "capture", "void")


def _factory(path: str) -> Any:
    if path == "simulated":
        path = "commitline.examples.simulated_gateway:create"
    elif path == "http":
        path = "commitline.examples.http_gateway:create"
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigurationError("COMMITLINE_GATEWAY", f"cannot import {module_name!r}: {e}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ConfigurationError("COMMITLINE_GATEWAY", f"{module_name!r} has no function {name!r}")
    return factory


def load_gateway(context: PortContext) -> PaymentGateway:
    """The configured gateway, made by its factory."""
    path = context.settings.gateway
    gateway = _factory(path)(context)
    missing = [op for op in OPERATIONS if not callable(getattr(gateway, op, None))]
    if missing:
        raise ConfigurationError("COMMITLINE_GATEWAY", f"{path!r} returned a {type(gateway).__name__}, which lacks "
                                 f"{', '.join(missing)}: not a PaymentGateway")
    return gateway
