"""The throughput mechanisms' failure modes, on a real PostgreSQL and real processes: a refusal inside a
coalesced batch touches nobody else, a process killed between two commands of a batch leaves nothing,
the aggregate cache never decides on a stream another process moved, ``dispatch_many`` gives each
command the outcome one-by-one dispatching would (a refusal or conflict in the middle, a kill between two
commands), and the connection group commit keeps between batches is replaced when the server ended it,
goes back through the pool regularly and on close, and never leaves a small pool without a connection."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from uuid import UUID, uuid4

import psycopg
import pytest

from commitline.application.chain import GENESIS, chain
from commitline.application.errors import ConcurrencyConflict
from commitline.application.ports import IdempotencyRecord, KeyAlreadyRecorded, StreamMoved
from commitline.composition import Commitline, bootstrap
from commitline.examples.inventory import InventoryItem, StockReceived
from commitline.domain.aggregate import utcnow
from commitline.infrastructure.store.codec import encode_event
from commitline.infrastructure.store.recorder import PendingAppend
from tests.support import count_rows, settings_for, wait_for


def received(item: UUID, version: int, key: str, *, tenant: str = "default", head: bytes = GENESIS) -> PendingAppend:
    """The append of one ``receive_stock`` command at ``version``, its hash chain continued from ``head`` (the
    stored hash of version - 1: the store refuses an append that does not continue it)."""
    event = StockReceived(event_id=uuid4(), aggregate_id=item, version=version, occurred_at=utcnow(), quantity=1)
    stored = [encode_event(event, tenant)]
    return PendingAppend(stored, IdempotencyRecord(tenant, key, key.encode().ljust(32, b"."), "receive_stock", item,
                                                   version, b"{}"), chain(head, stored))


def keys(pg_dsn: str, schema: str) -> set[str]:
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        return {r[0] for r in conn.execute(f'SELECT key FROM "{schema}".idempotency_keys')}


def test_a_conflict_inside_a_batch_refuses_that_command_only(app: Commitline, pg_dsn: str, schema: str) -> None:
    taken, free = uuid4(), uuid4()
    assert app.store.committer is not None, "group commit is on by default"
    app.store.committer.append_many([received(taken, 1, "first")])
    before = count_rows(pg_dsn, schema)

    outcomes = app.store.committer.append_many([
        received(free, 1, "a"),
        received(taken, 1, "loses-the-version"),  # version 1 of this stream is stored: the stream moved
        received(uuid4(), 1, "first"),  # a twin's key: recorded already
        received(taken, 2, "b", head=app.recorder.event_hash(taken, 1)),
    ])

    assert isinstance(outcomes[1], StreamMoved) and isinstance(outcomes[2], KeyAlreadyRecorded)
    assert all(isinstance(o, list) and len(o) == 1 for o in (outcomes[0], outcomes[3])), outcomes
    after = count_rows(pg_dsn, schema)
    # Each refused command wrote nothing, neither its event nor its key; the others committed.
    assert (after["events"] - before["events"], after["idempotency_keys"] - before["idempotency_keys"]) == (2, 2)
    assert {"a", "b"} <= keys(pg_dsn, schema) and "loses-the-version" not in keys(pg_dsn, schema)
    assert app.store.load(InventoryItem, taken).version == 2


def test_a_command_with_several_events_in_a_batch_stores_them_all_in_order(app: Commitline) -> None:
    item = uuid4()
    events = [StockReceived(event_id=uuid4(), aggregate_id=item, version=v, occurred_at=utcnow(), quantity=v)
              for v in (1, 2, 3)]
    stored = [encode_event(e, "default") for e in events]
    many = PendingAppend(stored, None, chain(GENESIS, stored))
    outcomes = app.store.committer.append_many([received(uuid4(), 1, "m1"), many])  # type: ignore[union-attr]
    assert isinstance(outcomes[1], list) and len(outcomes[1]) == 3 and outcomes[1] == sorted(outcomes[1])
    assert app.store.load(InventoryItem, item, use_snapshot=False).on_hand == 6
    assert app.auditor().verify().ok


def test_an_error_inside_a_batch_fails_that_command_only(app: Commitline, pg_dsn: str, schema: str) -> None:
    from psycopg import errors as pg_errors

    before = count_rows(pg_dsn, schema)
    outcomes = app.store.committer.append_many([  # type: ignore[union-attr]
        received(uuid4(), 1, "e1"),
        received(uuid4(), 0, "e-bad"),  # version 0 breaks the table's CHECK: an error that is no refusal
        received(uuid4(), 1, "e2"),
    ])
    assert isinstance(outcomes[1], pg_errors.CheckViolation), outcomes[1]
    assert isinstance(outcomes[0], list) and isinstance(outcomes[2], list), outcomes
    after = count_rows(pg_dsn, schema)
    assert (after["events"] - before["events"], after["idempotency_keys"] - before["idempotency_keys"]) == (2, 2)
    assert "e-bad" not in keys(pg_dsn, schema)


def test_a_batch_sent_with_either_kind_of_sync_has_the_same_outcomes(app: Commitline, pg_dsn: str, schema: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from psycopg import pq

    from commitline.infrastructure.store import pipelined

    if pq.__impl__ == "binary" and pq.version() >= 170000:  # what the pinned psycopg[binary] brings
        assert pipelined._pipeline_sync is not pipelined.plain_sync, "the sync's socket write releases the GIL"
    taken = uuid4()
    for sync, tag in ((pipelined._pipeline_sync, "released"), (pipelined.plain_sync, "plain")):
        monkeypatch.setattr(pipelined, "_pipeline_sync", sync)
        outcomes = app.store.committer.append_many([  # type: ignore[union-attr]
            received(uuid4(), 1, f"{tag}-a"), received(taken, 1, f"{tag}-b"), received(uuid4(), 1, f"{tag}-c")])
        if tag == "released":
            assert all(isinstance(o, list) for o in outcomes), outcomes
        else:  # ``taken`` has its version 1 already
            assert isinstance(outcomes[1], StreamMoved) and isinstance(outcomes[0], list) and isinstance(
                outcomes[2], list), outcomes
    assert {"released-a", "released-b", "released-c", "plain-a", "plain-c"} <= keys(pg_dsn, schema)


def test_racers_coalesced_into_batches_still_have_one_winner(app: Commitline, pg_dsn: str, schema: str) -> None:
    from tests.integration.test_concurrency import run_at_once

    item = app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="make")
    others = [app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1},
                           idempotency_key=f"other-{i}").aggregate_id for i in range(8)]

    def racer(i: int) -> object:
        if i % 2:  # bystanders on their own streams, in the same batches
            return app.dispatch({"type": "receive_stock", "item_id": str(others[i // 2]), "quantity": 1},
                                idempotency_key=f"bystander-{i}")
        return app.dispatch({"type": "receive_stock", "item_id": str(item.aggregate_id), "quantity": 1,
                             "expected_version": 1}, idempotency_key=f"racer-{i}")

    outcomes = run_at_once(16, racer)
    racers, bystanders = outcomes[0::2], outcomes[1::2]
    assert sum(not isinstance(o, BaseException) for o in racers) == 1
    assert sum(isinstance(o, ConcurrencyConflict) for o in racers) == 7
    assert not any(isinstance(o, BaseException) for o in bystanders), bystanders
    assert app.store.load(InventoryItem, item.aggregate_id).version == 2


def test_a_process_killed_between_two_commands_of_a_batch_leaves_nothing(app: Commitline, pg_dsn: str,
                                                                         schema: str) -> None:
    first, second = uuid4(), uuid4()
    before = count_rows(pg_dsn, schema)
    script = textwrap.dedent(f"""
        import os, signal
        from uuid import UUID
        from commitline.composition import bootstrap
        from tests.support import settings_for
        from tests.integration.test_throughput_mechanisms import received
        app = bootstrap(settings_for({pg_dsn!r}, {schema!r}))
        app.recorder.between_commands = lambda inserted: os.kill(os.getpid(), signal.SIGKILL)
        app.store.committer.append_many([received(UUID("{first}"), 1, "k1"), received(UUID("{second}"), 1, "k2")])
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert count_rows(pg_dsn, schema) == before
    # Nothing was acknowledged, nothing is stored: the same commands go through once, in full.
    outcomes = app.store.committer.append_many([received(first, 1, "k1"), received(second, 1, "k2")])  # type: ignore[union-attr]
    assert all(isinstance(o, list) for o in outcomes), outcomes
    assert {"k1", "k2"} <= keys(pg_dsn, schema)


def test_the_cache_applies_what_another_process_wrote(app: Commitline, pg_dsn: str, schema: str) -> None:
    item = app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="i1")
    assert len(app.store.cache), "the written aggregate is cached"
    other_process(pg_dsn, schema, item.aggregate_id, "from-elsewhere", 10)

    result = app.dispatch({"type": "receive_stock", "item_id": str(item.aggregate_id), "quantity": 100,
                           "expected_version": 2}, idempotency_key="i3")

    assert result.version == 3
    assert app.store.load(InventoryItem, item.aggregate_id, use_snapshot=False).on_hand == 111
    assert app.store.load(InventoryItem, item.aggregate_id).on_hand == 111


def test_a_decision_on_a_state_gone_stale_after_the_read_is_retried_not_stored(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    item = app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="j1")
    read = app.recorder.read_for_command
    calls: list[int] = []

    def read_then_another_process_writes(*args: object, **kwargs: object) -> object:
        found = read(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(1)
        if len(calls) == 1:  # between this command's read and its append, another process moves the stream
            other_process(pg_dsn, schema, item.aggregate_id, f"in-between-{uuid4()}", 10)
        return found

    app.recorder.read_for_command = read_then_another_process_writes  # type: ignore[method-assign]
    app.store.cache.take(item.aggregate_id)  # not cached: this command reads before it decides
    try:
        result = app.dispatch({"type": "receive_stock", "item_id": str(item.aggregate_id), "quantity": 100},
                              idempotency_key="j3")
    finally:
        del app.recorder.read_for_command
    assert len(calls) == 2, "the append was refused and the command re-read the stream"
    assert result.version == 3
    assert app.store.load(InventoryItem, item.aggregate_id, use_snapshot=False).on_hand == 111

    # With expected_version the same race is a conflict, never a write on the stale state.
    app.recorder.read_for_command = read_then_another_process_writes  # type: ignore[method-assign]
    app.store.cache.take(item.aggregate_id)
    calls.clear()
    try:
        with pytest.raises(ConcurrencyConflict):
            app.dispatch({"type": "receive_stock", "item_id": str(item.aggregate_id), "quantity": 1000,
                          "expected_version": 3}, idempotency_key="j5")
    finally:
        del app.recorder.read_for_command
    assert app.store.load(InventoryItem, item.aggregate_id, use_snapshot=False).on_hand == 121


def counting_reads(app: Commitline) -> list[UUID]:
    """Record every command read of the store (``read_for_command``) from now on: the ids read."""
    read = app.recorder.read_for_command
    reads: list[UUID] = []

    def counted(aggregate_id: UUID, *args: object) -> object:
        reads.append(aggregate_id)
        return read(aggregate_id, *args)  # type: ignore[arg-type]

    app.recorder.read_for_command = counted  # type: ignore[method-assign]
    return reads


def test_a_cached_stream_is_decided_on_without_a_read_and_a_stale_copy_is_never_stored(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    item = app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="z1")
    reads = counting_reads(app)
    try:
        app.dispatch(receive(item.aggregate_id), idempotency_key="z2")
        assert reads == [], "this process wrote the stream last: its cached copy needs no read"

        other_process(pg_dsn, schema, item.aggregate_id, "z-elsewhere", 10)  # v3, unknown to our cache
        result = app.dispatch(receive(item.aggregate_id, 100), idempotency_key="z4")
        # Decided on the stale copy (v2), refused by the append's version check, read, decided again.
        assert result.version == 4 and reads == [item.aggregate_id]
        assert app.store.load(InventoryItem, item.aggregate_id, use_snapshot=False).on_hand == 112

        # A stream another writer moved is read before every later command, in this process.
        app.dispatch(receive(item.aggregate_id), idempotency_key="z5")
        assert reads == [item.aggregate_id] * 2
    finally:
        del app.recorder.read_for_command
    assert count_rows(pg_dsn, schema)["events"] == 5


def test_a_key_used_by_another_process_answers_even_when_the_copy_is_cached(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    item = app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="y1")
    other_process(pg_dsn, schema, item.aggregate_id, "y-twin", 10)
    first = app.store.load(InventoryItem, item.aggregate_id, use_snapshot=False)
    before = count_rows(pg_dsn, schema)

    # The same request again, here: the answer is the other process's outcome, and nothing is written.
    replay = app.dispatch(receive(item.aggregate_id, 10), idempotency_key="y-twin")
    assert replay.replayed and replay.version == 2
    # The same key for another request: refused as reused, even though the copy would accept it.
    from commitline.application.errors import IdempotencyKeyReused
    with pytest.raises(IdempotencyKeyReused):
        app.dispatch(receive(item.aggregate_id, 5), idempotency_key="y-twin")
    assert count_rows(pg_dsn, schema) == before
    assert app.store.load(InventoryItem, item.aggregate_id, use_snapshot=False).on_hand == first.on_hand == 11


def test_expected_version_on_a_stale_cached_copy_follows_the_stored_stream(
        app: Commitline, pg_dsn: str, schema: str) -> None:
    item = app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="x1")
    other_process(pg_dsn, schema, item.aggregate_id, "x-elsewhere", 10)  # stored: v2; cached: v1

    # The copy says v1: a command expecting v1 is refused as the stored stream says (v2), not stored.
    with pytest.raises(ConcurrencyConflict) as conflict:
        app.dispatch(receive(item.aggregate_id, expected_version=1), idempotency_key="x3")
    assert conflict.value.actual == 2
    # A command expecting v2 is accepted, though the copy it started from said v1.
    assert app.dispatch(receive(item.aggregate_id, expected_version=2), idempotency_key="x4").version == 3


def test_with_expected_version_a_lost_race_to_its_own_twin_answers_with_the_twins_outcome(
        app: Commitline, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two batches that cross can deadlock; the victim's command is then refused like a lost version. If the
    # winner was this command's own twin (a retry racing the first try), the twin's outcome is the answer.
    from commitline.composition import bootstrap
    from tests.support import settings_for

    item = app.dispatch({"type": "receive_stock", "item_id": str(uuid4()), "quantity": 1}, idempotency_key="w1")
    command = receive(item.aggregate_id, 5, expected_version=1)
    real_append = app.store.append

    def twin_wins_then_this_one_loses(*args: object, **kwargs: object) -> None:
        with bootstrap(settings_for(pg_dsn, schema)) as elsewhere:
            elsewhere.dispatch(command, idempotency_key="w2")
        raise StreamMoved("DeadlockDetected")

    app.store.cache.take(item.aggregate_id)  # a read-verified run, as after any cache miss
    monkeypatch.setattr(app.store, "append", twin_wins_then_this_one_loses)
    result = app.dispatch(command, idempotency_key="w2")
    monkeypatch.setattr(app.store, "append", real_append)

    assert result.replayed and result.version == 2
    assert app.store.load(InventoryItem, item.aggregate_id, use_snapshot=False).on_hand == 6


def test_an_error_code_psycopg_does_not_know_fails_only_its_own_command(app: Commitline, pg_dsn: str,
                                                                         schema: str) -> None:
    import psycopg
    from eventsourcing.persistence import StoredEvent
    from psycopg import errors as pg_errors

    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # a trigger of the operator's with its own SQLSTATE
        conn.execute(f'''CREATE FUNCTION "{schema}".refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.topic = 'Poison' THEN RAISE EXCEPTION 'poison refused' USING ERRCODE = 'CL001'; END IF;
            RETURN NEW; END $$''')
        conn.execute(f'''CREATE TRIGGER refuse_poison BEFORE INSERT ON "{schema}".events
            FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse_poison()''')
    poison = [StoredEvent(uuid4(), 1, "Poison", b'{"tenant": "default"}')]
    outcomes = app.store.committer.append_many([  # type: ignore[union-attr]
        received(uuid4(), 1, "p1"), PendingAppend(poison, None, chain(GENESIS, poison)), received(uuid4(), 1, "p2")])
    assert isinstance(outcomes[1], pg_errors.DatabaseError) and "CL001" in str(outcomes[1]), outcomes[1]
    assert isinstance(outcomes[0], list) and isinstance(outcomes[2], list), outcomes
    assert {"p1", "p2"} <= keys(pg_dsn, schema)


def other_process(pg_dsn: str, schema: str, item: UUID, key: str, quantity: int) -> None:
    """``commitline dispatch`` in a process of its own (its own pool and cache)."""
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema}
    command = '{"type": "receive_stock", "item_id": "%s", "quantity": %d}' % (item, quantity)
    out = subprocess.run([sys.executable, "-m", "commitline.cli", "dispatch", "-k", key, command],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


# -- dispatch_many: a batch caller's commands, each atomic on its own, results in input order --------------


def receive(item: UUID, quantity: int = 1, **extra: object) -> dict[str, object]:
    return {"type": "receive_stock", "item_id": str(item), "quantity": quantity, **extra}


def test_dispatch_many_a_refusal_in_the_middle_touches_nobody_else(app: Commitline, pg_dsn: str,
                                                                   schema: str) -> None:
    from commitline.application.errors import AggregateNotFound, InvalidCommand, InvalidTenant, MissingIdempotencyKey

    a, b, missing = uuid4(), uuid4(), uuid4()
    before = count_rows(pg_dsn, schema)
    outcomes = app.processor.dispatch_many([
        (receive(a), "m1", "default"),
        ({"type": "reserve_stock", "item_id": str(missing), "reservation_id": "r", "quantity": 1}, "m2", "default"),
        (receive(b, quantity=0), "m3", "default"),  # invalid: refused before any I/O
        (receive(b), None, "default"),  # no key
        (receive(b), "m5", "default"),
        (receive(a), "m6", "default"),
        (receive(a), "m7", ["not", "a", "tenant"]),  # type: ignore[list-item]
    ])
    assert isinstance(outcomes[1], AggregateNotFound)
    assert isinstance(outcomes[2], InvalidCommand) and isinstance(outcomes[3], MissingIdempotencyKey)
    assert isinstance(outcomes[6], InvalidTenant)
    assert [o.version for o in (outcomes[0], outcomes[4], outcomes[5])] == [1, 1, 2]  # type: ignore[union-attr]
    after = count_rows(pg_dsn, schema)
    assert (after["events"] - before["events"], after["idempotency_keys"] - before["idempotency_keys"]) == (3, 3)
    assert {"m1", "m5", "m6"} <= keys(pg_dsn, schema) and not {"m2", "m3"} & keys(pg_dsn, schema)
    assert app.store.load(InventoryItem, a).on_hand == 2


def test_dispatch_many_gives_the_results_of_one_by_one_dispatching(app: Commitline) -> None:
    """Commands on one stream, or sharing a key, are not run at once: a conflict is the one sequential
    dispatching gives, a later command sees an earlier one's effect, a repeated key replays."""
    from commitline.application.errors import IdempotencyKeyReused

    item, payment = uuid4(), uuid4()
    bystanders = [uuid4() for _ in range(6)]
    outcomes = app.processor.dispatch_many([
        (receive(item), "s1", "default"),
        *[(receive(other), f"by-{i}", "default") for i, other in enumerate(bystanders)],
        (receive(item, expected_version=1), "s2", "default"),
        (receive(item, expected_version=1), "s3", "default"),  # lost to s2: a conflict, as one by one
        ({"type": "create_payment", "payment_id": str(payment), "currency": "EUR", "amount": "1.00",
          "account": "acc"}, "p1", "default"),
        ({"type": "submit_payment", "payment_id": str(payment)}, "p2", "default"),  # after its creation
        (receive(item), "s1", "default"),  # the first line again: replayed
        (receive(item, quantity=5), "s1", "default"),  # its key, another command
    ])
    assert outcomes[0].version == 1 and outcomes[7].version == 2  # type: ignore[union-attr]
    assert all(o.version == 1 for o in outcomes[1:7])  # type: ignore[union-attr]
    assert isinstance(outcomes[8], ConcurrencyConflict)
    assert outcomes[9].version == 1 and outcomes[10].version == 2  # type: ignore[union-attr]
    assert outcomes[11].replayed and outcomes[11].version == 1  # type: ignore[union-attr]
    assert isinstance(outcomes[12], IdempotencyKeyReused)
    assert app.store.load(InventoryItem, item).on_hand == 2


def test_dispatch_many_killed_between_two_commands_loses_nothing_acknowledged(app: Commitline, pg_dsn: str,
                                                                              schema: str) -> None:
    item, other = uuid4(), uuid4()
    items = [(receive(item), "c1", "default"), (receive(other), "c2", "default"), (receive(item), "c3", "default")]
    script = textwrap.dedent(f"""
        import os, signal
        from commitline.composition import bootstrap
        from tests.support import settings_for
        from tests.integration.test_throughput_mechanisms import receive
        from uuid import UUID
        app = bootstrap(settings_for({pg_dsn!r}, {schema!r}))
        append, calls = app.store.append, []
        def append_then_die(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:  # the first wave (c1, c2) is committed; c3 never goes out
                os.kill(os.getpid(), signal.SIGKILL)
            return append(*args, **kwargs)
        app.store.append = append_then_die
        item, other = UUID("{item}"), UUID("{other}")
        app.processor.dispatch_many([(receive(item), "c1", "default"), (receive(other), "c2", "default"),
                                     (receive(item), "c3", "default")])
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert {"c1", "c2"} <= keys(pg_dsn, schema) and "c3" not in keys(pg_dsn, schema)

    # The caller runs the same batch again: what was committed is replayed, the rest applied, once.
    outcomes = app.processor.dispatch_many(items)
    assert [(o.replayed, o.version) for o in outcomes] == [(True, 1), (True, 1), (False, 2)]  # type: ignore[union-attr]
    assert app.store.load(InventoryItem, item).on_hand == 2 and app.store.load(InventoryItem, other).on_hand == 1


# -- the connection group commit keeps between batches


def named(pg_dsn: str, name: str) -> str:
    """``pg_dsn`` with an application_name, so this test's sessions can be told from every other."""
    return f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}application_name={name}"


def sessions(pg_dsn: str, name: str) -> list[int]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return [pid for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                                (name,))]


def pool_requests(app: Commitline) -> int:
    return app.datastore.pool.get_stats().get("requests_num", 0)


def received_once(app: Commitline, item: UUID | None, key: str) -> UUID:
    command = {"type": "receive_stock", "item_id": str(item or uuid4()), "quantity": 1}
    return app.dispatch(command, idempotency_key=key).aggregate_id


def test_group_commit_keeps_its_connection_between_batches_and_gives_it_back_on_close(pg_dsn: str,
                                                                                      schema: str) -> None:
    name = f"kept-{uuid4().hex[:8]}"
    app = bootstrap(settings_for(named(pg_dsn, name), schema))
    try:
        item = received_once(app, None, "first")
        before = pool_requests(app)
        for n in range(20):  # a cached stream: no read, and every batch on the kept connection
            received_once(app, item, f"next-{n}")
        assert pool_requests(app) == before
        assert app.store.load(InventoryItem, item).version == 21
        assert sessions(pg_dsn, name)
    finally:
        app.close()
    wait_for(lambda: not sessions(pg_dsn, name), "every session of the closed app to end, the kept one too")


def test_a_kept_connection_goes_back_through_the_pool_regularly(pg_dsn: str, schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        item = received_once(app, None, "first")
        app.datastore.KEEP_FOR_S = 0.0  # kept for no time at all: every batch takes one from the pool again
        before = pool_requests(app)
        for n in range(5):
            received_once(app, item, f"next-{n}")
        assert pool_requests(app) - before == 5


def test_a_kept_connection_the_server_ended_is_replaced_before_use(pg_dsn: str, schema: str) -> None:
    name = f"ended-{uuid4().hex[:8]}"
    with bootstrap(settings_for(named(pg_dsn, name), schema)) as app:
        item = received_once(app, None, "first")
        ended = sessions(pg_dsn, name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the kept one and the pool's idle ones
            for pid in ended:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: not set(ended) & set(sessions(pg_dsn, name)), "the terminated sessions to end")

        assert app.dispatch({"type": "receive_stock", "item_id": str(item), "quantity": 1},
                            idempotency_key="after").version == 2
        assert app.store.load(InventoryItem, item, use_snapshot=False).version == 2


def test_a_small_pool_is_never_left_without_a_connection_for_other_callers(pg_dsn: str, schema: str) -> None:
    # Two connections in all: group commit keeps none, so a caller finds one while another is in use.
    with bootstrap(settings_for(pg_dsn, schema, pool_size=1, pool_max_overflow=1, pool_timeout_s=2)) as app:
        item = received_once(app, None, "first")
        received_once(app, item, "second")
        with app.datastore.pool.connection():
            assert app.store.load(InventoryItem, item, use_snapshot=False).version == 2
            assert received_once(app, item, "third") == item
