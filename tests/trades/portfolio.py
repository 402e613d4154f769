"""A portfolio's trades (seed 004): each trade is a machine of its own, PENDING -> EXECUTED | REJECTED,
recorded on its portfolio's stream, so one portfolio's trades are stored, published and read in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field

from commitline import (Aggregate, AggregateNotFound, Amount, Changes, Domain, DomainError, Event, Id, Projection,
                        Quantity, RecordedEvent, Reads, Stream, Table, VersionedCommand, on, transitions)

domain = Domain("trades")
TradeId = Annotated[str, Field(min_length=1, max_length=64)]


class TradeState(str, Enum):
    PENDING = "PENDING"
    EXECUTED = "EXECUTED"
    REJECTED = "REJECTED"


class TradePlaced(Event):
    trade_id: str
    symbol: str
    side: str
    quantity: int


class TradeExecuted(Event):
    trade_id: str
    price: Decimal


class TradeRejected(Event):
    trade_id: str
    reason: str


@domain.error
class UnknownTrade(DomainError):
    code, status, fields = "unknown_trade", 404, ("portfolio_id", "trade_id")
    message = "portfolio {portfolio_id} has no trade {trade_id}"


@domain.error
class DuplicateTrade(DomainError):
    code, status, fields = "duplicate_trade", 409, ("portfolio_id", "trade_id")
    message = "portfolio {portfolio_id} already has a trade {trade_id}"


@dataclass
class Trade:
    symbol: str
    side: str
    quantity: int
    state: TradeState = TradeState.PENDING
    price: Decimal | None = None


@domain.aggregate
class Portfolio(Aggregate):
    trades: dict[str, Trade] = field(default_factory=dict)

    EVENTS = (TradePlaced, TradeExecuted, TradeRejected)
    TRANSITIONS = transitions({TradeState.PENDING: {TradeState.EXECUTED, TradeState.REJECTED},
                               TradeState.EXECUTED: set(), TradeState.REJECTED: set()})
    MACHINE = ("trade", "trades")  # one machine per trade

    def place(self, trade_id: str, symbol: str, side: str, quantity: int) -> None:
        if trade_id in self.trades:
            raise DuplicateTrade(str(self.id), trade_id)
        self._emit(TradePlaced, trade_id=trade_id, symbol=symbol, side=side, quantity=quantity)

    def execute(self, trade_id: str, price: Decimal) -> None:
        self._moving(trade_id, TradeState.EXECUTED)
        self._emit(TradeExecuted, trade_id=trade_id, price=price)

    def reject(self, trade_id: str, reason: str) -> None:
        self._moving(trade_id, TradeState.REJECTED)
        self._emit(TradeRejected, trade_id=trade_id, reason=reason)

    def _moving(self, trade_id: str, target: TradeState) -> None:
        if trade_id not in self.trades:
            raise UnknownTrade(str(self.id), trade_id)
        self._transition(target, trade_id)

    def _evolve(self, event: Event) -> None:
        match event:
            case TradePlaced(trade_id=t, symbol=symbol, side=side, quantity=quantity):
                self.trades[t] = Trade(symbol, side, quantity)
            case TradeExecuted(trade_id=t, price=price):
                self.trades[t].state, self.trades[t].price = TradeState.EXECUTED, price
            case TradeRejected(trade_id=t):
                self.trades[t].state = TradeState.REJECTED


class PlaceTrade(VersionedCommand):
    portfolio_id: Id
    trade_id: TradeId
    symbol: Annotated[str, Field(pattern=r"^[A-Z]{1,12}$")]
    side: Literal["buy", "sell"]
    quantity: Quantity


class ExecuteTrade(VersionedCommand):
    portfolio_id: Id
    trade_id: TradeId
    price: Amount


class RejectTrade(VersionedCommand):
    portfolio_id: Id
    trade_id: TradeId
    reason: Annotated[str, Field(min_length=1, max_length=200)]


@domain.handles(PlaceTrade, Portfolio, Stream.ANY, id="portfolio_id")
def place_trade(portfolio: Portfolio, cmd: PlaceTrade) -> None:
    portfolio.place(cmd.trade_id, cmd.symbol, cmd.side, cmd.quantity)


@domain.handles(ExecuteTrade, Portfolio, id="portfolio_id")
def execute_trade(portfolio: Portfolio, cmd: ExecuteTrade) -> None:
    portfolio.execute(cmd.trade_id, cmd.price)


@domain.handles(RejectTrade, Portfolio, id="portfolio_id")
def reject_trade(portfolio: Portfolio, cmd: RejectTrade) -> None:
    portfolio.reject(cmd.trade_id, cmd.reason)


@domain.read_model
class TradeBook(Projection):
    """Every trade with its state, and trades per (tenant, state)."""

    name = "trade_book"
    tables = (
        Table("rm_trades", {"portfolio_id": "uuid", "trade_id": "text", "tenant": "text", "symbol": "text",
                            "state": "text"}, key=("portfolio_id", "trade_id")),
        Table("rm_trade_counts", {"tenant": "text", "state": "text", "trades": "bigint"}, key=("tenant", "state"),
              counters=("trades",)),
    )
    prefetch = {"rm_trades": lambda r: (r.event.aggregate_id, r.event.trade_id)
                if not isinstance(r.event, TradePlaced) else None}

    @on(TradePlaced)
    def placed(self, changes: Changes, r: RecordedEvent) -> None:
        changes.put("rm_trades", (r.event.aggregate_id, r.event.trade_id), tenant=r.tenant, symbol=r.event.symbol,
                    state=TradeState.PENDING.value)
        changes.add("rm_trade_counts", (r.tenant, TradeState.PENDING.value), trades=1)

    @on(TradeExecuted, TradeRejected)
    def settled(self, changes: Changes, r: RecordedEvent) -> None:
        state = TradeState.EXECUTED if isinstance(r.event, TradeExecuted) else TradeState.REJECTED
        changes.put("rm_trades", (r.event.aggregate_id, r.event.trade_id), state=state.value)
        changes.add("rm_trade_counts", (r.tenant, TradeState.PENDING.value), trades=-1)
        changes.add("rm_trade_counts", (r.tenant, state.value), trades=1)


@domain.reader
class TradeReads(Reads):
    def portfolio(self, portfolio_id: UUID, tenant: str) -> dict[str, str]:
        return dict(self.rows("SELECT trade_id, state FROM {t} WHERE portfolio_id = %s AND tenant = %s "
                              "ORDER BY trade_id", "rm_trades", (portfolio_id, self.tenant(tenant))))

    def counts(self, tenant: str) -> dict[str, int]:
        return {s: int(n) for s, n in self.rows("SELECT state, trades FROM {t} WHERE tenant = %s",
                                                 "rm_trade_counts", (self.tenant(tenant),))}


@domain.query("trades/{portfolio_id}", summary="A portfolio's trades and their states")
def portfolio_trades(reads: TradeReads, tenant: str, portfolio_id: UUID) -> dict[str, object]:
    trades = reads.portfolio(portfolio_id, tenant)
    if not trades:
        raise AggregateNotFound("Portfolio", portfolio_id)
    return {"portfolio_id": portfolio_id, "trades": trades}
