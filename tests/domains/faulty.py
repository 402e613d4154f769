"""A domain with a defect in a handler (it raises TypeError): a command of it is answered as an internal error and
writes nothing (``test_choosing_a_domain.py``)."""

from __future__ import annotations

from commitline import Command, Domain, Id, Stream
from tests.domains import quiet

domain = Domain("faulty").include(quiet.domain)


class Break(Command):
    lamp_id: Id


@domain.handles(Break, quiet.Lamp, Stream.ANY, id="lamp_id")
def break_it(lamp: quiet.Lamp, cmd: Break) -> None:
    lamp.switch(cmd.lamp_id, "on")  # type: ignore[call-arg]  # the defect: switch takes one argument
