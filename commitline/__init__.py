"""commitline: an event-sourced command processor for systems where a wrong state costs money.

``from commitline import bootstrap`` is the way in: it wires configuration to the store, the
command processor and every follower (see ``commitline.composition``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Commitline", "bootstrap"]


def __getattr__(name: str) -> Any:
    # Lazy, so importing the pure domain does not load the database and Kafka clients.
    if name in __all__:
        from commitline import composition

        return getattr(composition, name)
    raise AttributeError(f"module 'commitline' has no attribute {name!r}")
