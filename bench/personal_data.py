"""The cost of personal data (crypto-shredding): appends and rebuilds with a personal field against the same
without, and the time to erase one subject in a large store.

Every figure compares the two builds of ``bench/personal_domain.py``, identical but for the email being
declared personal (``sealed``: AES-GCM under the holder's data key) or not (``plain``), each in its own schema of
the same database.

``personal_append``
    commands/s of the same commands on both builds, at 1 and 32 writers (the ends of ``throughput``'s 1-32;
    the 32 writers' threads all on one CPU, where commitline's own server puts them, the single writer free):

    - ``new subject per command``: each writer loops ``open_holder`` with a new holder id: a new stream, and for
      ``sealed`` a new data key (inserted by the command's append, in its transaction);
    - ``existing subjects``: each writer loops ``change_email`` on its own holder, opened beforehand: the key is
      held by the process, so ``sealed`` adds only the encryption (and seals its snapshots, one per 100 events).

    Each measurement opens the app afresh, warms up, counts the commands done in a fixed window; the two builds
    alternate their order every round, and the best of three rounds (``--quick``: one) counts. Afterwards the
    stored events are checked: every event of ``sealed`` holds its email as ``{"ciphertext", "key_id"}`` and no
    email in plain text, every event of ``plain`` holds it in plain text.

``personal_rebuild``
    events/s of ``rebuild("holder_emails")`` over logs of the same 200,000 events (``--quick``: 40,000): 20,000
    holders (4,000), 10 events each, every one handled and (``sealed``) opened, the keys of each batch read in
    one statement (``projections/batches.py``). Logs written by ``bench/personal_log.py``, then ANALYZEd. Also
    measured, to show where the cost is: the rebuild's read + decode alone (``select_notifications`` of 5,000,
    the page's keys preloaded, ``decode_event`` of each event). Each pass runs in a freshly opened app, so no
    key is held before it starts; best of three (``--quick``: two), the builds alternating. The two read models
    are checked equal.

``personal_erase``
    ``erase(tenant, subject)`` of one holder in a store of 1,000,000 events of 100,000 holders, each with its
    data key (``--quick``: 100,000 events, 10,000 keys), pre-filled by ``bench/personal_log.py`` (keys by COPY,
    sealed events through ``recorder.append``; the time is printed). The median of 9 (``--quick``: 5) erasures
    of different holders, each timed around ``app.erase(..., rebuild=False)`` (the key: what makes the values
    unreadable in events, outcomes, snapshots and Kafka records); target < 1 s. Then one ``erase`` with its
    rebuild, timed: the read models that copy personal values, recomputed from the whole log. Then an erased
    holder loads with its email ``ERASED``, another with its email.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL, Identifier

from bench.command_throughput import Measurement, drive, placements
from bench.harness import BenchContext, commitline_app, fresh_schema
from bench.personal_domain import PLAIN, SEALED, BenchDomain
from bench.personal_log import TENANT, add_keys, email, write_log
from commitline import ERASED

BUILDS: dict[str, BenchDomain] = {"sealed": SEALED, "plain": PLAIN}
APPEND_WRITERS = (1, 32)
SNAPSHOT_INTERVAL = 100
BATCH = 5_000  # rebuild's default batch size; the decode-only pass reads pages of the same size
ERASE_TARGET_MS = 1000.0

# --------------------------------------------------------------------------- appends


def _new_subjects(app: Any, writers: int, run: str) -> Callable[[int, int], Any]:
    def command(i: int, seq: int) -> None:
        app.dispatch({"type": "open_holder", "holder_id": str(uuid.uuid4()), "email": f"w{i}.{seq}@example.org"},
                     idempotency_key=f"{run}-{i}-{seq}")
    return command


def _existing_subjects(app: Any, writers: int, run: str) -> Callable[[int, int], Any]:
    holders = [str(app.dispatch({"type": "open_holder", "holder_id": str(uuid.uuid4()), "email": f"w{i}@example.org"},
                                idempotency_key=f"{run}-open-{i}").aggregate_id) for i in range(writers)]

    def command(i: int, seq: int) -> None:
        app.dispatch({"type": "change_email", "holder_id": holders[i], "email": f"w{i}.{seq}@example.org"},
                     idempotency_key=f"{run}-{i}-{seq}")
    return command


MODES = {"new subject per command": _new_subjects, "existing subjects": _existing_subjects}


def measure(ctx: BenchContext, schema: str, build: str, mode: str, writers: int, warmup: float, duration: float,
            cpu: int | None) -> Measurement:
    run = uuid.uuid4().hex[:8]
    with commitline_app(ctx.dsn, schema, domain=BUILDS[build].domain, snapshot_interval=SNAPSHOT_INTERVAL) as app:
        return drive(writers, MODES[mode](app, writers, run), warmup, duration, cpu)


def stored_emails(dsn: str, schema: str) -> tuple[int, int, int, int]:
    """(events, emails sealed as {ciphertext, key_id}, events with an email in plain text, data keys)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(SQL(
            "SELECT count(*), count(*) FILTER (WHERE s -> 'data' -> 'email' ?& array['ciphertext', 'key_id']), "
            "count(*) FILTER (WHERE jsonb_typeof(s -> 'data' -> 'email') = 'string' "
            "OR convert_from(state, 'UTF8') LIKE '%@example%'), (SELECT count(*) FROM {keys}) "
            "FROM (SELECT state, convert_from(state, 'UTF8')::jsonb AS s FROM {events}) e").format(
                events=Identifier(schema, "events"), keys=Identifier(schema, "data_keys"))).fetchone()
    return row  # type: ignore[return-value]


def personal_append(ctx: BenchContext) -> Iterator[str]:
    warmup, duration, rounds = (0.3, 1.0, 1) if ctx.quick else (1.0, 3.0, 3)
    one_cpu = placements()[-1]
    with fresh_schema(ctx.dsn, "bench_sealed") as sealed, fresh_schema(ctx.dsn, "bench_plain") as plain:
        schemas = {"sealed": sealed, "plain": plain}
        for mode in MODES:
            for writers in APPEND_WRITERS:
                cpu = None if writers == 1 else one_cpu
                best: dict[str, Measurement] = {}
                for r in range(rounds):
                    for build in (("sealed", "plain") if r % 2 == 0 else ("plain", "sealed")):
                        m = measure(ctx, schemas[build], build, mode, writers, warmup, duration, cpu)
                        if build not in best or m.rate > best[build].rate:
                            best[build] = m
                s, p = best["sealed"], best["plain"]
                yield (f"personal append commands/s, {mode}, writers={writers}: sealed={s.rate:.0f} "
                       f"plain={p.rate:.0f} ratio={s.rate / p.rate if p.rate else float('inf'):.2f} "
                       f"(p50 {s.percentile(0.5) * 1000:.1f} / {p.percentile(0.5) * 1000:.1f} ms, "
                       f"p99 {s.percentile(0.99) * 1000:.1f} / {p.percentile(0.99) * 1000:.1f} ms; "
                       f"{'free' if cpu is None else f'cpu{cpu}'})")
                for build, m in best.items():
                    if m.errors:
                        yield (f"personal append errors, {mode}, writers={writers}: {build} {m.errors} failed, "
                               f"first: {type(m.first_error).__name__}: {m.first_error}")
        s_events, s_sealed, s_plain, s_keys = stored_emails(ctx.dsn, sealed)
        p_events, p_sealed, p_plain, p_keys = stored_emails(ctx.dsn, plain)
        ok = s_sealed == s_events and s_plain == 0 and p_plain == p_events and p_sealed == 0
        yield (f"personal append check: {'ok' if ok else 'FAILED'}: sealed store {s_sealed} of {s_events} events hold "
               f"the email as {{ciphertext, key_id}}, {s_plain} in plain text, {s_keys} data keys; plain store "
               f"{p_plain} of {p_events} in plain text, {p_sealed} sealed, {p_keys} data keys")


# --------------------------------------------------------------------------- rebuilds


def _analyze(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SQL("ANALYZE {}").format(Identifier(schema, "events")))


def _read_model(dsn: str, schema: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn) as conn:
        domains = conn.execute(SQL("SELECT tenant, email_domain, holders FROM {} ORDER BY 1, 2").format(
            Identifier(schema, "rm_email_domains"))).fetchall()
        holders = conn.execute(SQL("SELECT count(*), sum(email_length), sum(changes) FROM {}").format(
            Identifier(schema, "rm_holders"))).fetchone()
    return tuple(domains), holders


def _rebuild_pass(app: Any, build: str, total: int) -> float:
    t0 = time.perf_counter()
    result = app.rebuild("holder_emails")
    seconds = time.perf_counter() - t0
    if result.position != total or result.events_applied != total:
        raise RuntimeError(f"the {build} rebuild stopped at {result.position}, applied {result.events_applied}; "
                           f"expected {total}")
    return seconds


def _decode_pass(app: Any, build: str, total: int) -> float:
    """The rebuild's read and decode, without handlers or writes: pages of BATCH, keys read once a page."""
    position, seen = 0, 0
    t0 = time.perf_counter()
    while position < total:
        page = app.recorder.select_notifications(position + 1, BATCH)
        app.codec.preload_keys(n.state for n in page)
        for n in page:
            app.codec.decode_event(n.topic, n.originator_id, n.originator_version, n.state)
        seen, position = seen + len(page), page[-1].id
    if seen != total:
        raise RuntimeError(f"the {build} decode pass read {seen} events; expected {total}")
    return time.perf_counter() - t0


def personal_rebuild(ctx: BenchContext) -> Iterator[str]:
    total, per_holder = (40_000, 10) if ctx.quick else (200_000, 10)
    rounds = 2 if ctx.quick else 3
    holders = [uuid.uuid4() for _ in range(total // per_holder)]
    with fresh_schema(ctx.dsn, "bench_sealed") as sealed, fresh_schema(ctx.dsn, "bench_plain") as plain:
        schemas = {"sealed": sealed, "plain": plain}
        for build, schema in schemas.items():
            with commitline_app(ctx.dsn, schema, domain=BUILDS[build].domain) as app:
                personal = add_keys(app, ctx.dsn, schema, holders) if build == "sealed" else None
                written = write_log(app, BUILDS[build], holders, per_holder, personal)
                if written != total or (app.recorder.max_notification_id() or 0) != total:
                    raise RuntimeError(f"the {build} log has {written} events; expected {total}")
            _analyze(ctx.dsn, schema)
        best: dict[tuple[str, str], float] = {}
        for r in range(rounds):
            for build in (("sealed", "plain") if r % 2 == 0 else ("plain", "sealed")):
                for what, run in (("decode", _decode_pass), ("rebuild", _rebuild_pass)):
                    with commitline_app(ctx.dsn, schemas[build], domain=BUILDS[build].domain) as app:
                        seconds = run(app, build, total)
                    best[build, what] = min(best.get((build, what), seconds), seconds)
        rate = {key: total / seconds for key, seconds in best.items()}
        for what, label in (("rebuild", "rebuild holder_emails"), ("decode", "read + decode only")):
            sealed_rate, plain_rate = rate["sealed", what], rate["plain", what]
            yield (f"personal {label}, {total} events of {len(holders)} subjects: sealed={sealed_rate:.0f} events/s "
                   f"({best['sealed', what]:.1f} s) plain={plain_rate:.0f} events/s ({best['plain', what]:.1f} s) "
                   f"ratio={sealed_rate / plain_rate:.2f}")
        same = _read_model(ctx.dsn, sealed) == _read_model(ctx.dsn, plain)
        yield f"personal rebuild check: the sealed and plain read models {'match' if same else 'DIFFER'}"


# --------------------------------------------------------------------------- erasure


def personal_erase(ctx: BenchContext) -> Iterator[str]:
    keys, per_holder, erasures = (10_000, 10, 5) if ctx.quick else (100_000, 10, 9)
    total = keys * per_holder
    holders = [uuid.uuid4() for _ in range(keys)]
    with fresh_schema(ctx.dsn, "bench_erase") as schema, \
            commitline_app(ctx.dsn, schema, domain=SEALED.domain) as app:
        t0 = time.perf_counter()
        personal = add_keys(app, ctx.dsn, schema, holders)
        t1 = time.perf_counter()
        written = write_log(app, SEALED, holders, per_holder, personal)
        t2 = time.perf_counter()
        _analyze(ctx.dsn, schema)
        with psycopg.connect(ctx.dsn) as conn:
            (events,), (stored_keys,) = (conn.execute(SQL("SELECT count(*) FROM {}").format(
                Identifier(schema, table))).fetchone() for table in ("events", "data_keys"))
        if written != total or events != total or stored_keys != keys:
            raise RuntimeError(f"pre-filled {events} events and {stored_keys} keys; expected {total} and {keys}")
        yield (f"personal erase pre-fill{' (--quick: a smaller store)' if ctx.quick else ''}: {events} sealed events "
               f"of {keys} subjects, each with its data key, in {t2 - t0:.1f} s (keys {t1 - t0:.1f} s by COPY, "
               f"events {t2 - t1:.1f} s through recorder.append, {events / (t2 - t1):.0f} events/s)")

        chosen = [holders[(k * 2 + 1) * keys // (2 * erasures)] for k in range(erasures)]
        times = []
        for holder in chosen:
            t0 = time.perf_counter()
            done = app.erase(TENANT, str(holder), rebuild=False)  # the key alone: the read model's recompute follows
            times.append((time.perf_counter() - t0) * 1000)
            if len(done) != 1:
                raise RuntimeError(f"erasing {holder} deleted {len(done)} keys; expected 1")
        median = statistics.median(times)
        yield (f"erase one subject: events={events} keys={keys} median={median:.1f} ms (target < "
               f"{ERASE_TARGET_MS:.0f} ms: {'met' if median < ERASE_TARGET_MS else 'MISSED'}; {erasures} erasures "
               f"of different subjects, min {min(times):.1f} ms, max {max(times):.1f} ms)")
        t0 = time.perf_counter()
        report = app.erase(TENANT, str(chosen[0]))  # no key left: only the read models that copy personal values
        took = time.perf_counter() - t0
        yield (f"erase: recomputing the read models that copy personal values ({', '.join(report.read_models)}) "
               f"over {events} events took {took:.1f} s, once for any number of subjects erased before it "
               "(erase --no-rebuild, then one rebuild)")
        yield _check_erased(app, chosen[0], holders, per_holder)


def _check_erased(app: Any, erased: UUID, holders: list[UUID], per_holder: int) -> str:
    kept_number = 0 if holders[0] != erased else 1
    gone, kept = app.load(SEALED.holder, erased), app.load(SEALED.holder, holders[kept_number])
    ok = gone.email is ERASED and kept.email == email(kept_number, per_holder) and gone.version == per_holder
    return (f"personal erase check: {'ok' if ok else 'FAILED'}: the erased subject loads (v{gone.version}) with its "
            f"email {gone.email!r}, another with its own")


#: What ``python -m bench`` runs from this module, in order: (name, callable).
BENCHMARKS = (("personal_append", personal_append), ("personal_rebuild", personal_rebuild),
              ("personal_erase", personal_erase))
