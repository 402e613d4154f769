"""The publisher estimates a record's size (``record_size``) only when its value and type name come within
``SIZE_MARGIN`` plus its name of the broker's limit: everything else a record holds must stay below that margin,
or a record over the limit could be sent (and refused) instead of held back as a poison record."""

from __future__ import annotations

import uuid

from eventsourcing.persistence import Notification

from commitline.domain.aggregate import utcnow
from commitline.examples import domain
from commitline.examples.inventory import StockReceived
from commitline.infrastructure.kafka.envelope import RecordBuilder
from commitline.infrastructure.kafka.producer import record_size
from commitline.infrastructure.kafka.publisher import SIZE_MARGIN
from commitline.infrastructure.store.codec import encode_event


def test_what_a_record_holds_besides_its_value_and_type_name_stays_below_the_margin() -> None:
    event = StockReceived(event_id=uuid.uuid4(), aggregate_id=uuid.uuid4(), version=2**31, occurred_at=utcnow(),
                          quantity=1)
    stored = encode_event(event, "t" * 63)
    publisher = "p" * 500
    builder = RecordBuilder("prefix-" * 20, publisher, domain.registry, generation=2**62)
    record = builder.build(Notification(stored.originator_id, stored.originator_version, stored.topic, stored.state,
                                        2**62))
    rest = record_size(record) - len(record.value) - len(record.headers[1][1]) - len(publisher)
    assert 0 < rest <= SIZE_MARGIN
