"""Seed 004's portfolio trades, as a team outside commitline writes its domain: its own package, the public
API only. Run it with ``commitline --app tests.trades:domain ...`` (or ``COMMITLINE_APP``)."""

from tests.trades.portfolio import domain

__all__ = ["domain"]
