"""The projection base: a read model is its tables and its event handlers, nothing else.

Handlers never touch the database. They record changes in a ``Changes`` batch held in
memory: counter deltas (summed) and row values (last write wins). The projector flushes
one batch of events as one upsert per table plus the new position, in one transaction.
Rows a handler must read (an entity's previous state) are fetched for the whole batch
in one query per table before the handlers run (``prefetch``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any, ClassVar

from commitline.domain import Event
from commitline.infrastructure.store.codec import RecordedEvent

Key = tuple[Any, ...]
#: Sums decimals exactly, as the database's numeric does between batches: the default context rounds to 28
#: digits, so a batch's sum of amounts with many digits would depend on how the events fell into batches.
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


@dataclass(frozen=True)
class Table:
    """A read-model table. ``columns`` maps name -> SQL type; ``counters`` are added to, the rest set."""

    name: str
    columns: dict[str, str]
    key: tuple[str, ...]
    counters: tuple[str, ...] = ()

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if c not in self.key and c not in self.counters)


def summed(total: Any, delta: Any) -> Any:
    """A counter's ``total`` plus ``delta``, exact when either is a Decimal (no context rounding)."""
    return _EXACT.add(total, delta) if isinstance(delta, Decimal) or isinstance(total, Decimal) else total + delta


@dataclass
class Changes:
    """One batch's pending changes, per table and key."""

    tables: dict[str, Table]
    rows: dict[str, dict[Key, dict[str, Any]]] = field(default_factory=dict)
    loaded: dict[str, dict[Key, dict[str, Any] | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # per table, the counter and value columns (every handler call checks its columns against them)
        self._counters = {name: frozenset(t.counters) for name, t in self.tables.items()}
        self._values = {name: frozenset(t.values) for name, t in self.tables.items()}

    def add(self, table: str, key: Key, **deltas: Any) -> None:
        counters = self._counters[table]
        # ``_row`` written out: a rebuild calls ``add`` for most events, and the call would cost a few percent
        rows = self.rows.get(table)
        if rows is None:
            rows = self.rows[table] = {}
        row = rows.get(key)
        if row is None:
            row = rows[key] = {}
        for column, delta in deltas.items():
            if column not in counters:
                raise AssertionError(f"{table}.{column} is not a counter")
            total = row.get(column, 0)  # ``summed`` written out, for the same reason
            row[column] = _EXACT.add(total, delta) if isinstance(delta, Decimal) or isinstance(total, Decimal) \
                else total + delta

    def put(self, table: str, key: Key, **values: Any) -> None:
        """Set value columns of the row at ``key``. A value given as None leaves the column as it is (as the
        batch's upsert does with the stored row). Key columns and counters may be given when they hold what the
        row has (the key's values, the counter's total), so a row read by ``get`` can be put back changed."""
        if not self._values[table].issuperset(values):
            values = self._value_columns(table, key, values)
        row = self._row(table, key)
        if None in values.values():
            values = {c: v for c, v in values.items() if v is not None or c not in row}
        row.update(values)

    def get(self, table: str, key: Key) -> dict[str, Any] | None:
        """The whole row as it will be after this batch (None if it has none): its key columns, its value
        columns (None where never set) and its counters' totals, whether the row is stored, pending in this
        batch or both: the same for a handler whichever batch the row was written in."""
        loaded, rows = self.loaded.get(table), self.rows.get(table)
        stored = loaded.get(key) if loaded else None
        pending = rows.get(key) if rows else None
        if pending is None:
            return None if stored is None else dict(stored)  # a stored row has every column
        counters = self._counters[table]
        if stored is None:
            spec = self.tables[table]
            row = dict(zip(spec.key, key))
            for column in spec.columns:
                if column not in row:
                    row[column] = 0 if column in counters else None
        else:
            row = dict(stored)
        for column, value in pending.items():
            if column in counters:
                row[column] = summed(row[column], value)
            elif value is not None:
                row[column] = value
        return row

    def _value_columns(self, table: str, key: Key, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` without the key columns and counters, which must hold what the row has; anything else is a
        mistake in the handler."""
        spec = self.tables[table]
        given = dict(zip(spec.key, key))
        for column, value in values.items():
            if column in given:
                if value != given[column]:
                    raise AssertionError(f"{table}.{column} is a key column: put gives it {value!r}, the key "
                                         f"{given[column]!r}")
            elif column in self._counters[table]:
                current = (self.get(table, key) or {}).get(column, 0)
                if value != current:
                    raise AssertionError(f"{table}.{column} is a counter: changes.add adds to it, put cannot set it "
                                         f"(to {value!r}; its total is {current!r})")
            elif column not in self._values[table]:
                raise AssertionError(f"{table}.{column} is not a column of {table}")
        return {c: v for c, v in values.items() if c not in given and c not in self._counters[table]}

    def _row(self, table: str, key: Key) -> dict[str, Any]:
        rows = self.rows.get(table)
        if rows is None:
            rows = self.rows[table] = {}
        row = rows.get(key)
        if row is None:
            row = rows[key] = {}
        return row

    def __bool__(self) -> bool:
        return any(self.rows.values())


Handler = Callable[[Any, Changes, RecordedEvent], None]


def on(*event_types: type[Event]) -> Callable[[Handler], Handler]:
    """Mark a projection method as the handler of these event types."""

    def mark(handler: Handler) -> Handler:
        handler.__handles__ = event_types  # type: ignore[attr-defined]
        return handler

    return mark


class Projection:
    name: ClassVar[str]
    tables: ClassVar[tuple[Table, ...]]
    #: table -> function giving the key of the stored row an event's handler reads (None: none needed)
    prefetch: ClassVar[dict[str, Callable[[RecordedEvent], Key | None]]] = {}
    #: False on a read model that handles events with personal fields but stores none of their values (nor
    #: anything derived from them): erasing a subject then neither names it nor rebuilds it. Left True, a
    #: read model receiving personal fields is taken to copy them (``Domain.personal_projections``).
    copies_personal_data: ClassVar[bool] = True
    _handlers: ClassVar[dict[type[Event], Handler]]
    _topics: ClassVar[frozenset[str]]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._handlers = {
            event_type: member
            for member in vars(cls).values()
            for event_type in getattr(member, "__handles__", ())
        }
        cls._topics = frozenset(event_type.type_name() for event_type in cls._handlers)

    @classmethod
    def handles(cls, recorded: RecordedEvent) -> bool:
        return type(recorded.event) in cls._handlers

    @classmethod
    def handled_topics(cls) -> frozenset[str]:
        """The stored types (topics) of the events it handles."""
        return cls._topics

    def table_specs(self) -> dict[str, Table]:
        return {t.name: t for t in self.tables}

    def new_changes(self) -> Changes:
        return Changes(self.table_specs())

    def apply(self, changes: Changes, recorded: RecordedEvent) -> None:
        handler = self._handlers.get(type(recorded.event))
        if handler is not None:
            handler(self, changes, recorded)

    def keys_to_prefetch(self, events: Iterable[RecordedEvent]) -> dict[str, set[Key]]:
        wanted: dict[str, set[Key]] = {}
        for table, key_of in self.prefetch.items():
            keys = {k for k in (key_of(e) for e in events) if k is not None}
            if keys:
                wanted[table] = keys
        return wanted
