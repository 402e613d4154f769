"""What ``Commitline.status()`` returns: every follower with its liveness, the saga instances waiting for a
person, and the judgement of what is unhealthy (``commitline status``, ``--check``, the status page, metrics)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from commitline.application.process import StuckInstance
from commitline.infrastructure.followers.buckets import sequence_of
from commitline.infrastructure.followers.group_status import GroupStatus, Member
from commitline.infrastructure.followers.health import Problem, Thresholds, bucket_reasons, follower_reasons, judge
from commitline.infrastructure.followers.process import describe
from commitline.infrastructure.followers.status import FollowerStatus
from commitline.infrastructure.followers.went_back import is_went_back
from commitline.infrastructure.followers.group import UNOWNED_GRACE_SECONDS
from commitline.infrastructure.kafka.publisher import PUBLISHER
from commitline.infrastructure.store.audit_runs import ALL, AuditRun

__all__ = ["FOLLOWER_ALIASES", "PUBLISHER", "FollowerStatus", "StatusReport", "UnknownFollower"]


class UnknownFollower(LookupError):
    def __init__(self, unknown: Iterable[str], known: Iterable[str], aliases: Sequence[str] = ("publisher",)):
        """``aliases``: those that name followers here (``sagas`` only where the domain has process managers)."""
        said = f"alias: {aliases[0]}" if len(aliases) == 1 else f"aliases: {', '.join(aliases)}"
        super().__init__(f"unknown follower(s) {', '.join(unknown)}; known: {', '.join(known)} ({said})")


FOLLOWER_ALIASES = ("publisher", "sagas")  # the publisher; every process manager


@dataclass(frozen=True)
class StatusReport:
    """Every known follower (never-run ones too) with its liveness from PostgreSQL, the saga instances
    waiting for a person, and the lag thresholds ``problems()`` judges by (``followers/health.py``)."""

    head: int
    followers: list[FollowerStatus]
    stuck: list[StuckInstance]
    thresholds: Thresholds
    publisher: GroupStatus | None = None  # the publish instances and their buckets
    sagas: tuple[str, ...] = ()  # the process managers' follower names
    broken_audit: AuditRun | None = None  # the last verification, or the last of every stream, if it found breaks

    def follower_names(self, names: Iterable[str]) -> list[str]:
        """``names`` (or an alias: publisher, sagas) as follower names; UnknownFollower names any other."""
        names, known = list(names), [s.name for s in self.followers]
        resolved: list[str] = []
        unknown = []
        for name in names:
            expanded = [PUBLISHER] if name == "publisher" else list(self.sagas) if name == "sagas" else [name]
            if not expanded or any(n not in known for n in expanded):
                unknown.append(name)
            resolved += expanded
        if unknown:
            raise UnknownFollower(unknown, known, FOLLOWER_ALIASES if self.sagas else FOLLOWER_ALIASES[:1])
        return list(dict.fromkeys(resolved))

    def problems(self, only: Collection[str] | None = None) -> list[Problem]:
        """What is unhealthy: among all followers, or only those in ``only`` (which must then be running). The
        publisher is unhealthy also when it does not run while events wait for it; its buckets' problems are
        told once per instance (and reason), naming its buckets, instead of once per bucket."""
        buckets = self.bucket_problems() if only is None or PUBLISHER in only else []
        followers = [s for s in self.followers if not (buckets and s.name == PUBLISHER)]  # its row sums them up
        audit = [] if only is not None or self.broken_audit is None else [self.audit_problem(self.broken_audit)]
        return judge(followers, self.stuck, self.thresholds, only=only, unattended={PUBLISHER}) + buckets + audit

    @staticmethod
    def audit_problem(run: AuditRun) -> Problem:
        scope = "every stream" if run.scope == ALL else f"aggregate {run.aggregate_id}"
        return Problem("audit", f"the verification of {scope} at {run.finished_at:%Y-%m-%d %H:%M:%S %Z} found "
                       f"{run.broken} broken stream{'s' if run.broken != 1 else ''}: `commitline audit verify --all` "
                       "names them (healthy again once a verification finds none)")

    def bucket_problems(self) -> list[Problem]:
        if self.publisher is None:
            return []
        grouped: dict[tuple[str, str], list[int]] = {}
        for b, s in enumerate(self.publisher.buckets):
            owner = describe(s.process) if s.alive and s.process else s.owner or ""
            for reason in self.bucket_reasons(s):
                grouped.setdefault((owner, reason), []).append(b)
        return [Problem(f"{PUBLISHER} instance {owner}" if owner else f"{PUBLISHER} (no instance)",
                        f"{reason} (bucket{'s' if len(buckets) > 1 else ''} {sequence_of(buckets)})")
                for (owner, reason), buckets in grouped.items()]

    def bucket_reasons(self, bucket: FollowerStatus) -> list[str]:
        members = len(self.publisher.members) if self.publisher is not None else 0
        return bucket_reasons(bucket, self.thresholds, members, UNOWNED_GRACE_SECONDS)

    def reasons(self, follower: FollowerStatus) -> list[str]:
        """Why ``follower`` is unhealthy, as ``problems`` judges it (the publisher also when it does not run
        while events wait for it)."""
        return follower_reasons(follower, self.thresholds, unattended=follower.name == PUBLISHER)

    def owner_of(self, follower: FollowerStatus) -> str:
        """The process owning a follower (``host:pid (kind, started ...)``) while one holds it (for the publisher,
        its running instances), else the owner its row last named; never the PostgreSQL backend's pid, which is
        not a process of ours to act on."""
        if follower.alive and follower.process:
            return describe(follower.process)
        if follower.name == PUBLISHER and self.publisher is not None and self.publisher.members:
            return ", ".join(self.instance_of(m) for m in self.publisher.members)  # its buckets' owners
        return f"{follower.owner} (last)" if follower.owner else ""

    @staticmethod
    def instance_of(member: Member) -> str:
        """A publish instance, as the process it is (or the owner it names)."""
        return describe(member.process) or member.owner or "?"

    def publisher_dict(self) -> dict[str, Any] | None:
        """The publish instances and every bucket with its lag (events and seconds) and problems, as JSON."""
        if self.publisher is None:
            return None
        out = self.publisher.as_dict()
        for row, bucket in zip(out["buckets"], self.publisher.buckets):
            row["problems"] = self.bucket_reasons(bucket)
        return out

    @property
    def publisher_ran(self) -> bool:
        """Whether the publisher ever ran with buckets (an instance now, or a bucket's row)."""
        group = self.publisher
        return group is not None and bool(group.members or any(s.recorded_status is not None for s in group.buckets))

    @property
    def publisher_went_back(self) -> bool:
        """Whether a publisher bucket stopped because the store went back behind it (not at a poison record)."""
        return self.publisher is not None and any(is_went_back(b.error) for b in self.publisher.buckets)
