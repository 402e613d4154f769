"""What a caller gets from an application it closed, and from a batch in which one command's handler fails with
an exception of its own: typed errors, never a driver's exception, and no other outcome lost."""

from __future__ import annotations

from uuid import uuid4

import psycopg
import pytest

from commitline import Closed, UnexpectedFailure
from commitline.composition import bootstrap
from commitline.framework.loading import load_domain
from tests.domains import quiet
from tests.support import settings_for


def test_an_application_used_after_close_raises_closed(pg_dsn: str, schema: str) -> None:
    app = bootstrap(settings_for(pg_dsn, schema), domain=load_domain("tests.domains.quiet:domain"))
    lamp = uuid4()
    app.dispatch({"type": "switch", "lamp_id": str(lamp), "on": True}, idempotency_key="before")
    app.close()
    with pytest.raises(Closed) as refused:
        app.dispatch({"type": "switch", "lamp_id": str(lamp), "on": False}, idempotency_key="after")
    assert refused.value.code == "closed" and "same idempotency key" in str(refused.value)
    with pytest.raises(Closed):
        app.store.load(quiet.Lamp, lamp)


def test_a_batch_answers_a_handler_defect_as_a_typed_error_and_keeps_the_other_outcomes(pg_dsn: str,
                                                                                       schema: str) -> None:
    with bootstrap(settings_for(pg_dsn, schema), domain=load_domain("tests.domains.faulty:domain")) as app:
        good, bad = str(uuid4()), str(uuid4())
        outcomes = app.processor.dispatch_many([
            ({"type": "switch", "lamp_id": good, "on": True}, "good-1", "default"),
            ({"type": "break", "lamp_id": bad}, "bad-1", "default"),  # its handler raises TypeError
            ({"type": "switch", "lamp_id": bad, "on": True}, "good-2", "default"),
        ])
        applied, failed, after = outcomes
        assert not isinstance(applied, Exception) and applied.version == 1
        assert isinstance(failed, UnexpectedFailure) and failed.code == "internal_error"
        assert failed.details() == {"command_type": "break", "exception": "TypeError"}
        assert not isinstance(after, Exception) and after.version == 1
    with psycopg.connect(pg_dsn) as conn:
        stored = conn.execute(f'SELECT originator_id::text FROM "{schema}".events').fetchall()
    assert sorted(r[0] for r in stored) == sorted([good, bad])  # the two switches; nothing of the break
