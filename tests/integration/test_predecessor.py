"""An append proves its predecessor: version N of a stream is stored only if version N-1 is stored with the hash
the new event chains from (and version 1 only on a stream with no event), checked by the store in the append's
own statement, never by the process's cache.

A history lost underneath a process is staged the way an asynchronous failover loses it: the stream's first
command (its event and its key's record) is gone from the store while the process still has the aggregate
cached. Events are append-only (triggers), so the tests remove the row as a superuser with the session's
triggers off (``session_replication_role = replica``), exactly what the new primary would lack.
"""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID, uuid4

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent

from commitline.application.chain import GENESIS, chain
from commitline.application.errors import AggregateNotFound
from commitline.application.ports import IdempotencyRecord, PredecessorMissing
from commitline.composition import Commitline, bootstrap
from commitline.examples.inventory import InventoryItem
from commitline.infrastructure.store.recorder import PIPELINE_MAX_BYTES, EventRecorder, PendingAppend
from tests.integration.test_dispatching import Recorded, receive
from tests.support import count_rows, settings_for

PATHS = {"group-commit": 48, "one-transaction-per-command": 0}


@pytest.fixture(params=list(PATHS))
def writer(request: pytest.FixtureRequest, pg_dsn: str, schema: str) -> Iterator[Commitline]:
    """A commitline appending through the group commit's append functions, or one statement per command."""
    with bootstrap(settings_for(pg_dsn, schema, group_commit_max=PATHS[request.param])) as app:
        app.processor.observer = Recorded()
        yield app


def lose(pg_dsn: str, schema: str, stream: UUID, *, from_version: int = 1) -> None:
    """What a failover to an asynchronous standby loses: the stream's commands from ``from_version`` on, their
    events and their keys' records (the events' append-only triggers are off for this session only)."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(f'DELETE FROM "{schema}".events WHERE originator_id = %s AND originator_version >= %s',
                     (stream, from_version))
        conn.execute(f'DELETE FROM "{schema}".idempotency_keys WHERE aggregate_id = %s AND stream_version >= %s',
                     (stream, from_version))


def stored(pg_dsn: str, schema: str, stream: UUID) -> list[tuple[int, bytes, bytes]]:
    with psycopg.connect(pg_dsn) as conn:
        return [(v, bytes(p), bytes(h)) for v, p, h in conn.execute(
            f'SELECT originator_version, prev_hash, event_hash FROM "{schema}".events WHERE originator_id = %s '
            "ORDER BY originator_version", (stream,))]


# -- through dispatch: a cached copy never writes past a history that is no longer there -------------------------


def test_a_cached_aggregate_whose_history_was_lost_is_not_stored_past_it(writer: Commitline, pg_dsn: str,
                                                                         schema: str) -> None:
    created = writer.dispatch({"type": "create_payment", "amount": "5.00", "currency": "EUR", "account": "a"},
                              idempotency_key="create")
    payment = created.aggregate_id  # cached here at version 1
    lose(pg_dsn, schema, payment)
    before = count_rows(pg_dsn, schema)

    # The cached copy would have it at version 2 on a stream without version 1: refused, read, decided again.
    with pytest.raises(AggregateNotFound):
        writer.dispatch({"type": "submit_payment", "payment_id": str(payment)}, idempotency_key="submit")

    assert count_rows(pg_dsn, schema) == before and stored(pg_dsn, schema, payment) == []
    observed: Recorded = writer.processor.observer  # type: ignore[assignment]
    assert observed.outcomes[-1] == ("submit_payment", "refused", "aggregate_not_found")
    assert writer.auditor().verify().ok


def test_a_cached_aggregate_of_another_history_is_refused_and_decided_on_the_stored_one(
        writer: Commitline, pg_dsn: str, schema: str) -> None:
    item = writer.dispatch(receive(uuid4(), 1), idempotency_key="first").aggregate_id  # cached: on hand 1
    lose(pg_dsn, schema, item)
    with bootstrap(settings_for(pg_dsn, schema)) as elsewhere:  # the new primary's history: on hand 5
        elsewhere.dispatch(receive(item, 5), idempotency_key="first-again")
    (_, _, head), = stored(pg_dsn, schema, item)

    result = writer.dispatch(receive(item, 2), idempotency_key="more")

    # The copy (on hand 1) chained from a version 1 the store does not have: refused, read, decided on the store's.
    assert not result.replayed and result.version == 2
    assert [(v, p) for v, p, _ in stored(pg_dsn, schema, item)] == [(1, GENESIS), (2, head)]
    assert writer.store.load(InventoryItem, item).on_hand == 7
    observed: Recorded = writer.processor.observer  # type: ignore[assignment]
    assert observed.retries == ["receive_stock"]
    assert writer.auditor().verify().ok


def test_version_one_is_not_stored_on_a_stream_that_already_has_events(writer: Commitline, pg_dsn: str,
                                                                        schema: str) -> None:
    item = writer.dispatch(receive(uuid4(), 1), idempotency_key="first").aggregate_id
    writer.dispatch(receive(item, 1), idempotency_key="second")
    lose(pg_dsn, schema, item, from_version=1)
    with psycopg.connect(pg_dsn) as conn:  # a stream that starts at version 2 (what the unchecked append left)
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(f'INSERT INTO "{schema}".events (originator_id, originator_version, topic, state, prev_hash, '
                     "event_hash) VALUES (%s, 2, 'StockReceived', %s, %s, %s)", (item, b"{}", b"\x01" * 32, GENESIS))
    recorder: EventRecorder = writer.recorder
    first = StoredEvent(item, 1, "StockReceived", b'{"tenant": "default"}')

    refused = append(writer, [first], chain(GENESIS, [first]))

    assert isinstance(refused, PredecessorMissing)
    assert [v for v, _, _ in stored(pg_dsn, schema, item)] == [2]
    assert recorder.stream_version(item) == 2


# -- the store's append itself: both append paths, one command or several in a batch ----------------------------


def events(stream: UUID, versions: range, size: int = 16) -> list[StoredEvent]:
    return [StoredEvent(stream, v, "StockReceived", b'{"tenant": "default", "pad": "' + b"x" * size + b'"}')
            for v in versions]


def key(stream: UUID, version: int, name: str) -> IdempotencyRecord:
    return IdempotencyRecord("default", name, b"f" * 32, "receive_stock", stream, version, b"{}")


def append(app: Commitline, stored_events: list[StoredEvent], links: list[tuple[bytes, bytes]],
           idempotency: IdempotencyRecord | None = None) -> list[int] | Exception:
    """One command's append, by the path ``app`` appends with: its ids, or what refused it."""
    if app.store.committer is not None:
        return app.recorder.append_batch([PendingAppend(stored_events, idempotency, links)])[0]
    try:
        return app.recorder.append(stored_events, idempotency, links=links)
    except PredecessorMissing as e:
        return e


@pytest.mark.parametrize("size", [16, PIPELINE_MAX_BYTES], ids=["small", "large"])
def test_an_append_that_does_not_continue_the_stored_chain_writes_nothing(writer: Commitline, pg_dsn: str,
                                                                          schema: str, size: int) -> None:
    stream = uuid4()
    head = events(stream, range(1, 3), size)
    assert isinstance(append(writer, head, chain(GENESIS, head)), list)
    before = count_rows(pg_dsn, schema)
    tail = events(stream, range(3, 5), size)

    for links, why in [
        (chain(bytes(32 * [7]), tail), "another history's hash"),
        (chain(GENESIS, tail), "a stream it believes new"),
    ]:
        refused = append(writer, tail, links, key(stream, 4, f"k-{why}"))
        assert isinstance(refused, PredecessorMissing), why
        assert count_rows(pg_dsn, schema) == before, f"{why}: neither the events nor the key's record are written"
    broken = chain(stored(pg_dsn, schema, stream)[-1][2], tail)
    broken[1] = (bytes(32), broken[1][1])  # version 4 does not chain from version 3 of the same append
    assert isinstance(append(writer, tail, broken), PredecessorMissing)
    new_stream = events(uuid4(), range(1, 2), size)
    assert isinstance(append(writer, new_stream, chain(b"\x01" * 32, new_stream)), PredecessorMissing)
    assert count_rows(pg_dsn, schema) == before

    ids = append(writer, tail, chain(stored(pg_dsn, schema, stream)[-1][2], tail), key(stream, 4, "right"))
    assert isinstance(ids, list) and len(ids) == 2
    assert [v for v, _, _ in stored(pg_dsn, schema, stream)] == [1, 2, 3, 4]


def test_in_one_batch_a_predecessor_another_command_of_it_appends_counts_and_a_refusal_is_its_own(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    stream, other = uuid4(), uuid4()
    first, second = events(stream, range(1, 3)), events(stream, range(3, 4))
    first_links = chain(GENESIS, first)
    stray = events(other, range(2, 3))
    batch = [
        PendingAppend(first, key(stream, 2, "a"), first_links),
        PendingAppend(stray, key(other, 2, "b"), chain(bytes(32), stray)),  # its version 1 is nowhere
        PendingAppend(second, key(stream, 3, "c"), chain(first_links[-1][1], second)),  # continues the first
    ]

    outcomes = app.recorder.append_batch(batch)

    assert isinstance(outcomes[0], list) and isinstance(outcomes[2], list)
    assert isinstance(outcomes[1], PredecessorMissing)
    assert [v for v, _, _ in stored(pg_dsn, schema, stream)] == [1, 2, 3] and stored(pg_dsn, schema, other) == []
    with psycopg.connect(pg_dsn) as conn:
        keys = sorted(k for (k,) in conn.execute(f'SELECT key FROM "{schema}".idempotency_keys'))
    assert keys == ["a", "c"]
