"""The status page's unblock commands for a follower stopped at a poison event: each one names the exact
position, and each is a command the CLI accepts."""

from __future__ import annotations

import shlex

import pytest

from commitline.cli import build_parser
from commitline.http.status_page import unblock_commands
from commitline.infrastructure.followers.status import FollowerStatus
from commitline.infrastructure.kafka.publisher import PUBLISHER
from tests.support import PROJECTIONS


def stopped(name: str, at: int = 42) -> FollowerStatus:
    return FollowerStatus(name, "failed", "host:1", at - 1, at + 5, 6, 1.0, None,
                          {"position": at, "event_type": "PaymentSubmitted", "message": "LookupError: x"}, "failed")


@pytest.mark.parametrize(("name", "expected"), [
    (PUBLISHER, ["commitline publisher retry",
                 'commitline publisher skip --position 42 --reason "<why it is safe>"']),
    ("payment_states", ["commitline projections retry payment_states",
                        'commitline projections skip payment_states --position 42 --reason "<why it is safe>"']),
    ("order-fulfilment", []),  # retried by itself, never stopped at a poison event
])
def test_the_commands_name_the_follower_and_the_poison_position(name: str, expected: list[str]) -> None:
    assert unblock_commands(stopped(name), PROJECTIONS) == expected
    for command in expected:
        args = build_parser().parse_args(shlex.split(command)[1:])
        assert getattr(args, "position", 42) == 42
