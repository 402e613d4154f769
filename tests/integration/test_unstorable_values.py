"""A value an event's JSON cannot hold is refused before anything is written, with a typed error naming the event
and its field, and the aggregate goes on from its stored state: an integer beyond 64 bits and bytes in an ``Any`` field,
both from a handler, a NaN given to a command's float field in Python (which JSON over HTTP cannot
carry). Before, the first two failed as internal errors, and a NaN was stored as null, which no load could read
back again."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest

from commitline import EventNotStorable, InvalidCommand
from commitline.composition import bootstrap
from tests.domains import readings
from tests.support import count_rows, settings_for


def test_values_json_cannot_hold_are_refused_naming_the_field_and_nothing_is_written(pg_dsn: str,
                                                                                    schema: str) -> None:
    meter = str(uuid4())

    def record(app, key: str, value: int, ratio: float = 0.5):  # type: ignore[no-untyped-def]
        return app.dispatch({"type": "record", "meter_id": meter, "value": value, "ratio": ratio},
                            idempotency_key=key)

    with bootstrap(settings_for(pg_dsn, schema), domain=readings.domain) as app:
        assert record(app, "r-1", 5).version == 1
        with pytest.raises(EventNotStorable) as big:
            record(app, "r-2", -2)
        assert (big.value.command_type, big.value.event_type, big.value.field) == ("record", "Read", "value")
        assert big.value.code == "event_not_storable" and "64-bit" in str(big.value)
        with pytest.raises(EventNotStorable) as raw:
            record(app, "r-3", -1)
        assert raw.value.field == "extra"
        with pytest.raises(InvalidCommand, match="ratio"):
            record(app, "r-4", 7, float("nan"))
        rows = count_rows(pg_dsn, schema)
        assert (rows["events"], rows["idempotency_keys"]) == (1, 1)
        assert record(app, "r-2", 6).version == 2  # the refused keys were never recorded; the aggregate goes on
        assert app.store.load(readings.Meter, UUID(meter)).total == 11
    with bootstrap(settings_for(pg_dsn, schema), domain=readings.domain) as fresh:
        loaded = fresh.store.load(readings.Meter, UUID(meter))
        assert (loaded.version, loaded.total, loaded.readings) == (2, 11, 2)
