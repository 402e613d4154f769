"""A domain whose process manager's port cannot be made: its factory passes the connection parameters where a
connection string is expected, and the library it calls quotes them back in its error, password included. Used
by ``test_choosing_a_domain.py``: ``sagas run`` must stop at start naming the port and the line, without a
traceback and without the password."""

from __future__ import annotations

from typing import Any

from commitline import Domain, PortContext, ProcessManager
from tests.domains import quiet

domain = Domain("unconnected").include(quiet.domain)


class Carrier:
    def __init__(self, conninfo: Any) -> None:
        if not isinstance(conninfo, str):
            raise TypeError(f"a connection string was expected, got {conninfo!r}")


@domain.process_manager
class Notifier(ProcessManager):
    name = "notifier"
    triggers = (quiet.LampSwitched,)

    def advance(self, lamp_id: Any, tenant: str) -> str:
        return "DONE"


domain.port("carrier", lambda context: Carrier(context.conninfo))
