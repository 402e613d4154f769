"""The built-in examples: payments, inventory, surveys, and orders with their fulfilment saga, written
with commitline's public API only, as a team writes its own domain. ``commitline`` runs this domain when
no other is chosen (``--app`` / ``COMMITLINE_APP``); its store is the schema ``commitline`` and its
topics ``commitline.<aggregate type>``.

Each slice is a module of its own with its own ``Domain`` part; ``domain`` holds them all.
"""

from __future__ import annotations

from commitline import Domain
from commitline.examples import fulfilment, inventory, orders, payments, surveys
from commitline.examples import fulfilment_saga  # noqa: F401  (declares the process manager on fulfilment's part)
from commitline.examples.gateways import load_gateway
from commitline.examples.reads import ExampleReads


def _demo(settings: object) -> int:
    from commitline.examples.demo import run_demo

    return run_demo(settings)


domain = Domain("examples", schema="commitline", demo=_demo,
                include=[payments.domain, inventory.domain, surveys.domain, orders.domain, fulfilment.domain])
domain.reader(ExampleReads)
domain.port("payments", load_gateway)

__all__ = ["domain"]
