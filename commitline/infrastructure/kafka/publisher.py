"""The Kafka publisher's name, metrics and log; the publisher itself is ``partitioned.PartitionedPublisher``,
which publishes every bucket of aggregates it owns in one loop, reading the log once per round, with a
position per bucket (``COMMITLINE_PUBLISH_BUCKETS=1`` is one stream of the whole log).

Per bucket, while holding it:
  read the next batch after the saved position (gap-safe) -> build records ->
  send in per-partition order and wait for every ack (acks=all) -> save the position.
The position moves only after the broker acknowledged everything up to it, so a crash
at any instant means some records may be sent again on restart, never lost, never
reordered per aggregate. Each record carries its event id for consumer deduplication.

While the broker fails, the batch is retried with bounded exponential back-off; the
outage is logged once when it starts and once when it ends. Commands keep working: the
command path never talks to Kafka.

A record the broker cannot take (larger than ``COMMITLINE_KAFKA_MAX_MESSAGE_BYTES``, or
refused by the broker as too large) is a poison record, never retried on its own: the
events before it are published, the publisher stops at it with the reason in ``status``,
and waits for an operator: ``commitline publisher retry`` (after raising the limit) or
``commitline publisher skip --position N`` (kept in the intervention log).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
PUBLISHER = "kafka-publisher"
# aiokafka logs every failed connection attempt; the publisher reports an outage once itself.
logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


@dataclass
class PublisherMetrics:
    events_published: int = 0
    batches: int = 0
    retries: int = 0
    position: int = 0
    lag_events: int = 0
    started_at: float = field(default_factory=time.time)
