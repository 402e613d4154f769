"""The names of a follower group's buckets: each bucket's follower name (``kafka-publisher/07of16``), parsed
back, and bucket numbers for people (``0-3,7``).

Buckets divide the log by aggregate id (``store/log.py``: ``bucket_of``, ``BucketLog``) so that several
instances of a follower (the Kafka publisher) can work in parallel, each bucket owned by one of them
(``group.py``), with its own position row under its name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_NAME = re.compile(r"^(?P<group>.+)/(?P<bucket>\d+)of(?P<buckets>\d+)$")


def bucket_name(group: str, bucket: int, buckets: int) -> str:
    """The follower name of one bucket, e.g. ``kafka-publisher/07of16``: with the count, so that buckets of
    another count (another deployment's setting) never reuse its row."""
    return f"{group}/{bucket:0{len(str(buckets - 1))}d}of{buckets}"


@dataclass(frozen=True)
class BucketName:
    group: str
    bucket: int
    buckets: int


def parse_bucket_name(name: str) -> BucketName | None:
    """The group, bucket and count of a bucket's follower name; None for any other name."""
    m = _NAME.match(name)
    return BucketName(m["group"], int(m["bucket"]), int(m["buckets"])) if m else None


def sequence_of(ids: Sequence[int]) -> str:
    """Bucket numbers for people: ``0-3,7,9-10``."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
