"""The operator's store-level work, as ``Commitline`` does it for the CLI and the HTTP server: readiness,
schema migrations, the store's generations (showing the current one, starting another after a restore or an
asynchronous failover) and resetting a follower stopped because the store went back, skipping or retrying a
poison event (the publisher's in the bucket it stopped),
expiring idempotency records, verifying the hash chains with a record of each run, and the Prometheus text
of this process.

``Operations`` is a part of ``Commitline`` (``root.py``): its methods use the root's settings, datastore,
connection parameters and status."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from uuid import UUID

import psycopg

from commitline.application.audit import Progress, VerificationReport
from commitline.application.errors import ConfigurationError, StoreUnavailable
from commitline.infrastructure import migrations
from commitline.infrastructure.followers import interventions
from commitline.infrastructure.followers.buckets import bucket_name
from commitline.infrastructure.followers.group_status import count_in_use
from commitline.infrastructure.followers.interventions import InterventionRefused
from commitline.infrastructure.followers.positions import Positions
from commitline.infrastructure.kafka.publisher import PUBLISHER
from commitline.infrastructure.metrics import render
from commitline.infrastructure.store.audit_runs import ALL, AuditRun, AuditRuns
from commitline.infrastructure.store import generations
from commitline.infrastructure.store.datastore import describe_failure
from commitline.infrastructure.store.retention import expire_idempotency_records

READY_PROBE_TIMEOUT_S = 0.8  # /readyz answers within a second, the database up or not
READY_ANSWER_S = 2.0  # and within two once connected, the database answering or not
_PROBE_LOCK = threading.Lock()
UNREACHABLE = "database unreachable"  # how ``unready`` begins the reason of a database it cannot use

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigrationReport:
    """What ``migrate`` found and did: the schema's version before and after, what was pending, what it applied."""

    schema: str
    was: int
    version: int
    latest: int
    pending: list[migrations.Migration]
    applied: list[migrations.Migration]


class Operations:
    """What an operator asks of the store (a part of ``Commitline``)."""

    def unready(self) -> list[str]:
        """Why this process cannot serve now ([] when it can): the database does not answer, its schema is not
        at the version this commitline needs, or the domain has personal fields and no master key opens them
        (``COMMITLINE_MASTER_KEY`` unset with a configured database, or another store's key).

        Answered within ``READY_ANSWER_S`` whatever the database does: a server that takes the connection but
        does not answer (a stalled primary, a hung pooler, a partition) would otherwise hold the probe as long
        as it stalls. The probe runs in a thread of its own; while one has not finished, no other starts, and
        the database counts as not answering."""
        with _PROBE_LOCK:
            running = getattr(self, "_ready_probe", None)
            if running is None or running.done():
                running = self._ready_probe = Future()
                threading.Thread(target=self._probe_readiness, args=(running,), name="commitline-ready-probe",
                                 daemon=True).start()  # daemon: a probe stuck in a stall never holds an exit
        try:
            return running.result(timeout=READY_ANSWER_S)
        except FutureTimeout:
            return [f"{UNREACHABLE}: it took the connection but did not answer within {READY_ANSWER_S:g} s"]

    def _probe_readiness(self, answer: Future[list[str]]) -> None:
        try:
            answer.set_result(self._unready_now())
        except BaseException as e:  # noqa: BLE001 (said as the answer, as any other reason)
            answer.set_result([f"{UNREACHABLE}: {describe_failure(e, self.conninfo)}"])

    def _unready_now(self) -> list[str]:
        try:
            with self.datastore.probe_connection(READY_PROBE_TIMEOUT_S) as conn:
                missing = migrations.pending(conn, self.settings.schema_name)
        except migrations.SchemaTooNew as e:
            # A newer release migrated the store while this process runs (a rolling upgrade's first step): steps
            # only add, so it goes on serving until it is replaced; only a process starting now is refused.
            if not getattr(self, "_told_schema_newer", False):
                log.warning("%s; this process goes on serving (migrations only add) until it is replaced", e)
                self._told_schema_newer = True
            missing = []
        except StoreUnavailable as e:  # described already
            return [f"{UNREACHABLE}: {e.reason}"]
        except Exception as e:
            return [f"{UNREACHABLE}: {describe_failure(e, self.conninfo)}"]
        if missing:
            return [f"schema {self.settings.schema_name} lacks migration {m.version} ({m.description}); "
                    "run commitline migrate" for m in missing]
        personal = self.store.codec.personal
        if personal is not None and self.domain.has_personal_fields:
            try:  # checked against the key table as it is now: a rotation since may have retired this key
                personal.master_still_passes()
            except ConfigurationError as e:
                return [f"personal fields cannot be written or read: {e}"]
        return []

    def migrate(self, *, apply: bool = True) -> MigrationReport:
        """Bring the schema to the version this commitline needs (with ``apply`` False, only say how far behind
        it is); under the schema's advisory lock, so any number of processes may do it at once."""
        schema = self.settings.schema_name
        with psycopg.connect(**self.conninfo, autocommit=True) as conn:
            before = migrations.schema_version(conn, schema)
            todo = migrations.pending(conn, schema)
            applied = migrations.migrate(conn, schema) if apply else []
            after = migrations.schema_version(conn, schema)
        if apply and not applied and after != before:  # another process applied them meanwhile: none was ours
            before, todo = after, []
        return MigrationReport(schema, before, after, migrations.LATEST, todo, applied)

    def store_generation(self) -> generations.Generation:
        """The store's current generation: its number, since when, why, and the log head it started at."""
        with self.datastore.get_connection() as conn:
            return generations.current(conn, self.datastore.schema)

    def new_generation(self, reason: str) -> generations.Generation:
        """Start the store's next generation, after a restore or an asynchronous failover (before starting any
        follower): every follower then stops until ``reset_follower`` says where it goes on. ``reason`` (why)
        is required: InterventionRefused without one, nothing written."""
        if not reason.strip():
            raise InterventionRefused("a new store generation needs a reason (what happened: the restore, the "
                                      "failover)")
        with psycopg.connect(**self.conninfo, autocommit=True) as conn:
            return generations.new_generation(conn, self.datastore.schema, reason.strip())

    def reset_follower(self, name: str, choice: str, position: int | None = None, reason: str = "") -> str:
        """Reset follower ``name`` (a projection, a process manager's runner, or the publisher: ``publisher`` or
        ``kafka-publisher``, with all its buckets) after the store went back: ``choice`` ``from-head``, ``from``
        (with ``position``) or ``keep``, in the current generation (``interventions.reset``); what was done, as a
        sentence. UnknownFollower for a name the domain does not have; InterventionRefused for a bad choice or
        position, or a projection with counters moved back (they would count events twice), nothing written."""
        from commitline.composition.status import UnknownFollower

        follower = PUBLISHER if name == "publisher" else name
        known = [PUBLISHER, *sorted(self.domain.managers), *sorted(self.domain.projections)]
        if follower not in known:
            raise UnknownFollower([repr(name)], known)
        projection = self.domain.projections.get(follower)
        counters = [f"{t.name}.{c}" for t in projection.tables for c in t.counters] if projection else []
        if counters and choice == "from" and position is not None:
            with self.datastore.get_connection() as conn:
                current, _, _ = Positions(self.datastore.schema).read(conn, follower)
            if position < current:  # its counters already hold the events after ``position``: they would double
                raise InterventionRefused(
                    f"{follower} counts ({', '.join(counters)}): its rows already hold the events up to its position "
                    f"{current}, so --from {position} would count those after {position} a second time; --keep "
                    f"confirms its read model as it is, `commitline projections rebuild {follower}` recomputes it; "
                    "nothing was written")
        return interventions.reset(self.datastore, follower, choice, position, reason)

    def intervene(self, name: str, action: str, position: int | None = None, reason: str = "") -> str:
        """``skip`` (exactly the event at ``position``, for ``reason``) or ``retry`` the poison event follower
        ``name`` stopped at; what was done, as a sentence. InterventionRefused when it is not stopped there."""
        if name == PUBLISHER:
            return self._intervene_in_buckets(action, position, reason)
        if action == "skip":
            return interventions.skip(self.datastore, name, position, reason)
        return interventions.retry(self.datastore, name)

    def stopped_positions(self, name: str) -> list[int]:
        """The positions of the poison events follower ``name`` is stopped at (one per stopped bucket, for the
        publisher): what a ``retry`` tries again. Empty when it is not stopped at one."""
        positions = Positions(self.datastore.schema)
        with self.datastore.get_connection() as conn:
            stopped = [error for _, error in positions.stopped_in_group(conn, name)] if name == PUBLISHER else []
            if not stopped:
                _, status, error = positions.read(conn, name)
                stopped = [error] if status == "failed" and error else []
        return sorted(int(e["position"]) for e in stopped if isinstance(e.get("position"), int))

    def _intervene_in_buckets(self, action: str, position: int | None, reason: str) -> str:
        """A poison record stops only its publisher bucket: ``skip`` finds the bucket stopped at ``position``,
        ``retry`` retries every stopped bucket; then the publisher's own row is brought up to date."""
        positions = Positions(self.datastore.schema)
        with self.datastore.get_connection() as conn:
            stopped = positions.stopped_in_group(conn, PUBLISHER)
        if not stopped:  # nothing stopped in a bucket: the publisher's own row says why (or that nothing is)
            return (interventions.skip(self.datastore, PUBLISHER, position, reason) if action == "skip"
                    else interventions.retry(self.datastore, PUBLISHER))
        if action == "skip":
            bucket = next((n for n, error in stopped if error.get("position") == position), stopped[0][0])
            message = interventions.skip(self.datastore, bucket, position, reason)
        else:
            message = "\n".join(interventions.retry(self.datastore, bucket) for bucket, _ in stopped)
        with self.datastore.get_connection() as conn:
            _, status, _ = positions.read(conn, PUBLISHER)
            buckets = count_in_use(conn, self.datastore.schema, PUBLISHER, self.settings.publish_buckets)
            positions.write_summary(conn, PUBLISHER, [bucket_name(PUBLISHER, b, buckets) for b in range(buckets)], None,
                                    "stopped" if status in ("failed", "retrying", "never run") else status)
        return message

    def expire_idempotency_records(self, older_than: timedelta, *, dry_run: bool = False) -> int:
        """Delete (or, with ``dry_run``, count) the idempotency records recorded more than ``older_than`` ago."""
        return expire_idempotency_records(self.datastore, older_than, dry_run=dry_run)

    def verify_chains(self, aggregate_id: UUID | None = None, *, tenant: str = "default",
                      progress: Progress | None = None) -> VerificationReport:
        """Verify one stream's hash chain (or, without ``aggregate_id``, every tenant's), and record the run for
        the status page's "last verification"; a verification that raised (not found, interrupted) is none."""
        started_at = datetime.now(timezone.utc)
        report = self.auditor().verify(aggregate_id, progress=progress, tenant=tenant)
        self._audit_runs().record(started_at=started_at, ok=report.ok, streams=report.streams, events=report.events,
                                  broken=len(report.broken), seconds=report.seconds, aggregate_id=aggregate_id,
                                  tenant=tenant)
        return report

    def last_verifications(self) -> tuple[AuditRun | None, AuditRun | None]:
        """The last recorded verification of anything, and the last of every stream (``verify --all``)."""
        runs = self._audit_runs()
        return runs.last(), runs.last(ALL)

    def _audit_runs(self) -> AuditRuns:
        return AuditRuns(self.datastore.get_connection, self.settings.schema_name)

    def metrics_text(self) -> bytes:
        """This process's metrics and every follower's position and lag, in Prometheus' text format."""
        return render(self.status)
