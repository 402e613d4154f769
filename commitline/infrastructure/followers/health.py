"""What counts as unhealthy, and why: the judgement behind ``commitline status --check``.

Pure logic over ``FollowerStatus`` rows and stuck sagas, no I/O. Unhealthy, always:

- a follower ``dead`` (its row says it works, but no live session holds its lease);
- a follower stopped at a poison event (``failed``), or because the store went back behind it (``failed``
  with a ``store_went_back`` error, naming the reset to run), or ``retrying`` a failing batch;
- a live follower (not a rebuild, which lags by design) lagging beyond either threshold;
- a saga instance waiting for a person (STUCK, PARKED), when all followers are judged or its process
  manager is named;
- a bucket of a follower group (the publisher's) that is dead, failed, retrying or lagging, or that no
  live instance has owned for longer than a rebalance takes while instances run (``bucket_reasons``).

A follower ``stopped`` cleanly or ``never run`` is a deployment's choice, not a fault: it is
unhealthy only when ``only`` names it, i.e. when the caller says it should be running.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from commitline.application.process import StuckInstance
from commitline.infrastructure.followers.status import DEAD, NEVER_RUN, FollowerStatus
from commitline.infrastructure.followers.went_back import what_to_do

REBUILD_MARK = "@rebuild"


@dataclass(frozen=True)
class Thresholds:
    max_lag_events: int
    max_lag_seconds: float


@dataclass(frozen=True)
class Problem:
    subject: str  # a follower's name, or "order <id>"
    reason: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.reason}"


def follower_reasons(s: FollowerStatus, limits: Thresholds, *, required: bool = False,
                     unattended: bool = False) -> list[str]:
    """Why ``s`` is unhealthy (empty: it is not); ``required`` means it should be running; ``unattended`` that it
    should run whenever events wait for it (the publisher): not running while it lags is then a problem."""
    reasons = []
    error = s.error or {}
    if s.status == DEAD:
        reasons.append(f"dead: no live session holds its lease (last owner {s.owner or 'unknown'}, "
                       f"recorded {s.recorded_status})")
    elif s.status == "failed" and error.get("kind") == "store_went_back":
        todo = error.get("what_to_do", "")
        if s.older_generation is not None and isinstance(error.get("generation"), int) \
                and error["generation"] < s.older_generation[1]:  # the new generation it asked for has begun since
            todo = what_to_do(s.name)
        reasons.append(f"stopped at position {error.get('position', '?')}: the store went back: "
                       f"{error.get('reason', '')}; waiting for an operator: {todo}")
    elif s.status == "failed" and error.get("needs_rebuild"):
        reasons.append(f"stopped before its tables: {error.get('message', '')}")
    elif s.status == "failed":
        event = f" ({error['event_type']})" if error.get("event_type") else ""
        reasons.append(f"stopped at poison event {error.get('position', '?')}{event}: {error.get('message', '')}; "
                       "waiting for an operator's retry or skip")
    elif s.status == "retrying":
        reasons.append(f"retrying at position {error.get('position', '?')}: {error.get('message', '')}")
    elif required and s.status == NEVER_RUN:
        reasons.append("never run")
    elif required and not s.alive:
        reasons.append(f"{s.status}: not running (last owner {s.owner or 'unknown'})")
    if s.older_generation is not None and error.get("kind") != "store_went_back":  # not stopped yet: it will be
        saved, current = s.older_generation
        reasons.append(f"saved in store generation {saved}, the store is at {current} (a new generation began): it "
                       f"goes on only once reset: {what_to_do(s.name)}")
    lagging = s.lag_events > limits.max_lag_events or s.lag_seconds > limits.max_lag_seconds
    if unattended and not s.alive and s.status in (NEVER_RUN, "stopped") and lagging:
        reasons.append(f"{s.status} while {s.lag_events} events wait for it (the oldest {s.lag_seconds:.0f} s; "
                       f"limits {limits.max_lag_events} events / {limits.max_lag_seconds:g} s)")
    if s.alive and not s.name.endswith(REBUILD_MARK) and lagging:
        reasons.append(f"lagging by {s.lag_events} events / {s.lag_seconds:.1f} s "
                       f"(limits {limits.max_lag_events} events / {limits.max_lag_seconds:g} s)")
    return reasons


def bucket_reasons(s: FollowerStatus, limits: Thresholds, members: int, grace_seconds: float) -> list[str]:
    """Why a bucket of a follower group is unhealthy: as any follower, and also when nobody owns it for more
    than ``grace_seconds`` while ``members`` instances run (a rebalance hands buckets over in about a second)."""
    reasons = follower_reasons(s, limits)
    unowned_for = s.last_moved_seconds if s.last_moved_seconds is not None else float("inf")
    if members and not s.alive and s.status != DEAD and unowned_for > grace_seconds:
        since = "" if s.last_moved_seconds is None else f" for {s.last_moved_seconds:.0f} s"
        reasons.append(f"unowned{since} while {members} instance(s) run")
    return reasons


def judge(followers: Sequence[FollowerStatus], stuck: Sequence[StuckInstance], limits: Thresholds, *,
          only: Collection[str] | None = None, unattended: Collection[str] = ()) -> list[Problem]:
    """Every problem among ``followers`` (only those named in ``only``, when given) and ``stuck`` saga
    instances (each counted when ``only`` is None or names its process manager); followers in ``unattended``
    are a problem when not running while events wait for them."""
    problems = [Problem(s.name, reason) for s in followers if only is None or s.name in only
                for reason in follower_reasons(s, limits, required=only is not None,
                                               unattended=s.name in unattended)]
    problems += [Problem(s.subject, s.problem) for s in stuck if only is None or s.saga in only]
    return problems
