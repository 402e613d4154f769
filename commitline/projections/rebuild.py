"""Rebuilding a projection from the first event, with no half-built view ever visible.

1. Under the ``NAME@rebuild`` lease, replay the log into fresh ``*__next`` tables, saving
   the rebuild's position with every batch (interrupt it and run it again: it resumes, unless
   asked to start afresh: after an erasure, rows it wrote before may hold the erased values).
   A poison event the operator skipped on the live projection (``projections skip``) is skipped
   again, recorded in ``follower_interventions`` under ``NAME@rebuild`` with the decision it
   follows; so is one named with ``rebuild --skip N``. Any other poison event stops the rebuild
   with the exact command that passes it.
2. When caught up, wait for the live lease (the live projector yields it to a waiter),
   apply what arrived meanwhile, then in ONE transaction: drop the live tables, rename
   the rebuilt ones into place and set the live position. Readers see the old complete
   view until that commit and the new complete view after it.

``abort`` discards an abandoned rebuild: its ``*__next`` tables and its position row.

``rebuild_many`` rebuilds several projections reading the log once: each batch is decoded once for all
of them and applied to every projection that has not had it yet (each resumes from its own saved
position), the projections' transactions running side by side, one connection each; then each is
swapped in on its own, exactly as above.

The log is scanned without the events no projection being rebuilt handles: the database looks at them (their
ids prove the scan has no gap), but sends none of them, so the rebuild of one read model makes objects only for
its own events; its position still moves to the end of what was scanned. While a batch is
applied, the next one is read and decoded in a thread of its own (used when the
next round starts where the batch ended, as it does unless a poison event was skipped). A batch's
transaction (the ``__next`` rows and the rebuild's position) commits without waiting for its WAL
flush: a crash may lose the last batches, rows and position together, and the rebuild resumes from
the position that survived; the swap commits synchronously, which flushes everything before it.

A rebuild allocates millions of short-lived objects (rows, events, changes) and keeps a batch or two of
them alive at a time; with the collector's default thresholds they survive into the older generations,
whose collections rescan everything the process holds (measured: a third of a rebuild's CPU). So it runs
under ``infrastructure/collection.bulk_collection``: what exists already frozen, the youngest generation
collected every 50,000 allocations instead of 700, all set back afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from eventsourcing.persistence import Notification

from commitline.infrastructure.collection import bulk_collection
from commitline.infrastructure.followers.engine import GAP_POLL_SECONDS, Follower, Handled
from commitline.infrastructure.followers.lease import Lease, instance_id
from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.store.codec import EventCodec
from commitline.infrastructure.store.generations import current_and_head
from commitline.infrastructure.store.log import Scan
from commitline.infrastructure.store.recorder import EventRecorder
from commitline.projections.base import Projection
from commitline.projections.batches import apply_batch, decode_batch
from commitline.projections.storage import (
    REBUILD_SUFFIX,
    create_tables,
    declared_shape,
    drop_tables,
    shape_differences,
    stored_shape,
    swap_in,
    table_exists,
)

log = logging.getLogger(__name__)


class RebuildError(RuntimeError):
    #: raised by an erasure's recomputation: the erasures it had recorded before (none when the subject had no key)
    erased: tuple[object, ...] = ()


class RebuildRunning(RebuildError):
    """Another rebuild of the projection holds its lease: this one did not start (nothing was written)."""


@dataclass(frozen=True)
class RebuildResult:
    projection: str
    position: int
    events_applied: int
    seconds: float
    resumed_from: int


@dataclass
class RebuildMetrics:
    position: int = 0
    applied: int = 0


Progress = Callable[[int, int, int], None]  # (position, head, events applied so far)


def rebuild_name(projection: str) -> str:
    return f"{projection}@rebuild"


class _Replay(Follower):
    """Applies batches to the ``*__next`` tables, writing on ``writer`` (the rebuild's lease, then
    the live one); its position is the rebuild's own row. A poison event ends the rebuild unless it
    was skipped: on the live projection by an operator, or with ``--skip``."""

    def __init__(self, projection: Projection, codec: EventCodec, recorder: EventRecorder, conninfo: dict[str, Any],
                 batch_size: int, skip: dict[int, str]):
        super().__init__(recorder, conninfo, rebuild_name(projection.name), batch_size=batch_size, poll_interval=0)
        self.projection = projection
        self.codec = codec
        self.schema = recorder.datastore.schema
        self.writer: Lease = self.lease
        self.metrics = RebuildMetrics()
        self.skip = skip  # position -> reason given with --skip

    async def handle(self, batch: Sequence[Notification], position: int) -> Handled:
        return await self.apply(batch, position, None)

    async def apply(self, batch: Sequence[Notification], position: int, decoded: Sequence[Any] | None,
                    through: int | None = None) -> Handled:
        """Apply ``batch`` (``decoded``: as ``decode_batch`` made it, if done already) after ``position``, up to
        ``through`` (the log read that far; by default the batch's last event)."""
        outcome = await asyncio.to_thread(self.writer.run, lambda conn: apply_batch(
            conn, self.schema, self.projection, self.codec, self.lease.name, position, batch, REBUILD_SUFFIX,
            decoded=decoded, synchronous=False, through=through))
        self.metrics.applied += outcome.applied
        if outcome.poison is None:
            return Handled(outcome.position, saved=True)
        poison = outcome.poison
        decision = await asyncio.to_thread(self.writer.run, lambda conn: self._pass(conn, poison))
        if decision is None:
            name, at = self.projection.name, poison["position"]
            raise RebuildError(
                f"poison event at position {at} ({poison['event_type']}): {poison['message']}. The live projection "
                f"never skipped it. Fix the handler and run the rebuild again, or pass it with "
                f"`commitline projections rebuild {name} --skip {at} --reason \"…\"`")
        log.warning("rebuild of %s: skipped the poison event at position %d (%s)", self.projection.name,
                    poison["position"], decision)
        return Handled(poison["position"], saved=True)

    def _pass(self, conn: psycopg.Connection[Any], poison: dict[str, Any]) -> str | None:
        """Skip the poison event if a decision covers it: record that and move past it, in one transaction."""
        positions = Positions(self.schema)
        at = poison["position"]
        live = positions.skipped(conn, self.projection.name).get(at)
        if live is not None:
            detail = {"error": poison, "follows": {"name": self.projection.name, **live}}
            reason = f"skipped on the live projection: {live.get('reason') or 'no reason given'}"
        elif at in self.skip:
            detail = {"error": poison, "reason": self.skip[at]}
            reason = f"--skip {at}: {self.skip[at] or 'no reason given'}"
        else:
            return None
        with conn.transaction():
            positions.save(conn, self.lease.name, at)
            positions.record_intervention(conn, self.lease.name, "skip", at, detail)
        return reason


def rebuild(projection: Projection, codec: EventCodec, recorder: EventRecorder, conninfo: dict[str, Any], *,
            batch_size: int = 5000, progress: Progress | None = None, swap_timeout: float = 60.0,
            skip: dict[int, str] | None = None, fresh: bool = False) -> RebuildResult:
    """Rebuild ``projection``; ``skip`` maps poison positions to pass (beyond the live projection's skips) to
    the operator's reason; ``fresh``: see ``rebuild_many``."""
    return rebuild_many([projection], codec, recorder, conninfo, batch_size=batch_size, progress=progress,
                        swap_timeout=swap_timeout, skip=skip, fresh=fresh)[0]


def rebuild_many(projections: Sequence[Projection], codec: EventCodec, recorder: EventRecorder,
                 conninfo: dict[str, Any], *, batch_size: int = 5000, progress: Progress | None = None,
                 swap_timeout: float = 60.0, skip: dict[int, str] | None = None,
                 fresh: bool = False) -> list[RebuildResult]:
    """Rebuild every projection in ``projections``, reading the log once for all of them; ``fresh``: from the
    first event even where an interrupted rebuild could resume (its tables are discarded)."""
    with bulk_collection():
        return asyncio.run(_rebuild(list(projections), codec, recorder, conninfo, batch_size, progress, swap_timeout,
                                    skip or {}, fresh))


def abort(projection: Projection, recorder: EventRecorder, conninfo: dict[str, Any]) -> bool:
    """Discard an abandoned rebuild (its tables and position); False if there was none. Refused while one runs."""
    work = Lease(conninfo, recorder.datastore.schema, rebuild_name(projection.name), f"abort:{instance_id()}")
    if not work.try_acquire():
        raise RebuildError(f"a rebuild of {projection.name} is running: stop it first (Ctrl-C), then abort")
    schema = recorder.datastore.schema
    try:
        def discard(conn: psycopg.Connection[Any]) -> bool:
            positions = Positions(schema)
            with conn.transaction():
                existed = table_exists(conn, schema, projection, REBUILD_SUFFIX)
                drop_tables(conn, schema, projection, REBUILD_SUFFIX)
                positions.delete(conn, work.name)
            return existed

        found = work.run(discard)
    finally:
        work.release("stopped")  # the row is gone: nothing is written back
    if found:
        log.warning("rebuild of %s aborted: its tables and position were discarded", projection.name)
    return found


async def _rebuild(projections: list[Projection], codec: EventCodec, recorder: EventRecorder,
                   conninfo: dict[str, Any], batch_size: int, progress: Progress | None, swap_timeout: float,
                   skip: dict[int, str], fresh: bool = False) -> list[RebuildResult]:
    replays = [_Replay(p, codec, recorder, conninfo, batch_size, skip) for p in projections]
    held: list[_Replay] = []
    started = time.perf_counter()
    try:
        for replay in replays:
            if not await asyncio.to_thread(replay.lease.try_acquire):
                raise RebuildRunning(f"a rebuild of {replay.projection.name} is already running")
            held.append(replay)
        # each projection on its own connection: prepared side by side, swapped in side by side
        resumed = await _together([asyncio.to_thread(r.lease.run, lambda conn, r=r: _prepare(
            conn, r.schema, r.projection, r.lease.name, fresh)) for r in replays])
        positions = await _catch_up_together(replays, list(resumed), recorder, batch_size, progress)
        swapped = await _together([_swap_in_live(replay, position, conninfo, swap_timeout, progress)
                                   for replay, position in zip(replays, positions)])
        results = []
        for replay, position, resumed_from in zip(replays, swapped, resumed):
            applied = replay.metrics.applied
            log.info("rebuilt %s up to position %d (%d events applied)", replay.projection.name, position, applied)
            results.append(RebuildResult(replay.projection.name, position, applied, time.perf_counter() - started,
                                         resumed_from))
        return results
    finally:
        for replay in replays:
            await replay.wakeup.close()
        for replay in held:
            await asyncio.to_thread(replay.lease.release, "stopped")


async def _catch_up_together(replays: list[_Replay], positions: list[int], recorder: EventRecorder, batch_size: int,
                             progress: Progress | None) -> list[int]:
    """Read the log once up to its head, giving each replay the part of each batch it has not applied yet
    (decoded once for all of them; the replays' transactions side by side). The next batch is read and
    decoded while this one is applied."""
    topics = frozenset().union(*(r.projection.handled_topics() for r in replays))
    codec = replays[0].codec
    # Events of the domain's other types are only passed over: scanned, never sent (one of a type the domain does
    # not know is sent whole, as it is poison to every projection and its error is reported).
    passed_over = sorted(set(codec.registry.event_types) - topics)

    def read(start: int) -> tuple[Scan, list[Any], int]:
        scan = recorder.scan_notifications(start + 1, batch_size, passed_over)
        head = recorder.max_notification_id() or 0
        return scan, decode_batch(codec, scan.notifications, topics), head

    ahead: tuple[int, asyncio.Future[tuple[Scan, list[Any], int]]] | None = None
    try:
        while True:
            start = min(positions)
            if ahead is not None and ahead[0] == start:
                scan, decoded, head = await ahead[1]
            else:
                if ahead is not None:
                    await _settled(ahead[1])
                scan, decoded, head = await asyncio.to_thread(read, start)
            ahead = None
            through = scan.through
            if through <= start:
                if head <= start:
                    return positions
                await asyncio.sleep(GAP_POLL_SECONDS)  # a gap still being proven at the head
                continue
            if scan.full:  # there is likely more: read it meanwhile
                ahead = (through, asyncio.ensure_future(asyncio.to_thread(read, through)))
            batch = scan.notifications
            behind = [i for i in range(len(replays)) if positions[i] < through]
            work = []
            for i in behind:
                skip = next((k for k, n in enumerate(batch) if n.id > positions[i]), len(batch))
                work.append(replays[i].apply(batch[skip:], positions[i], decoded[skip:], through))
            for i, outcome in zip(behind, await _together(work)):
                positions[i] = replays[i].metrics.position = outcome.position
            if progress is not None:
                progress(min(positions), head, sum(r.metrics.applied for r in replays))
    finally:
        if ahead is not None:
            await _settled(ahead[1])


async def _together(work: list[Any]) -> list[Any]:
    """The results of ``work`` run side by side; the first error once every one has ended."""
    outcomes = await asyncio.gather(*work, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


async def _settled(future: asyncio.Future[Any]) -> None:
    """Wait for a read ahead that will not be used (a thread cannot be cancelled), ignoring its outcome."""
    try:
        await future
    except Exception:  # nothing depends on it
        pass


async def _swap_in_live(replay: _Replay, position: int, conninfo: dict[str, Any], swap_timeout: float,
                        progress: Progress | None) -> int:
    """Take the live lease (the live projector yields it), apply what arrived meanwhile, swap: the new position."""
    projection = replay.projection
    live = Lease(conninfo, replay.schema, projection.name, f"rebuild:{instance_id()}")
    if not await asyncio.to_thread(live.acquire, swap_timeout):
        raise RebuildError(f"the live projector of {projection.name} did not yield within {swap_timeout:.0f} s; "
                           f"the rebuilt tables are kept, run the rebuild again to resume")
    report = (lambda at, head: progress(at, head, replay.metrics.applied)) if progress else None
    try:
        replay.writer = live
        position = await replay.catch_up(live, position, report)
        await asyncio.to_thread(live.run, lambda conn: _swap(conn, replay.schema, projection, position,
                                                             replay.lease.name))
    finally:
        await asyncio.to_thread(live.release, "stopped")
    return position


def _prepare(conn: psycopg.Connection[Any], schema: str, projection: Projection, follower: str,
             fresh: bool = False) -> int:
    """The position to resume from: 0 with fresh tables (always when ``fresh``), or where an interrupted
    rebuild stopped."""
    positions = Positions(schema)
    position, status, _ = positions.read(conn, follower)
    # Tables of another shape were left by an interrupted rebuild of another commitline version: start afresh.
    other_shape = bool(shape_differences(declared_shape(conn, projection),
                                         stored_shape(conn, schema, projection, REBUILD_SUFFIX)))
    if fresh or position == 0 or status == "failed" or other_shape or not table_exists(conn, schema, projection,
                                                                              REBUILD_SUFFIX):
        with conn.transaction():
            drop_tables(conn, schema, projection, REBUILD_SUFFIX)
            create_tables(conn, schema, projection, REBUILD_SUFFIX)
            positions.save(conn, follower, 0)
        return 0
    return position


def _swap(conn: psycopg.Connection[Any], schema: str, projection: Projection, position: int, follower: str) -> None:
    positions = Positions(schema)
    with conn.transaction():
        create_tables(conn, schema, projection)  # the first rebuild of a projection that never ran live
        swap_in(conn, schema, projection)
        # The rebuilt view is the store's as it is now: the live row goes on in the current generation.
        positions.save(conn, projection.name, position, generation=current_and_head(conn, schema)[0])
        positions.delete(conn, follower)
