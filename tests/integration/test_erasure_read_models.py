"""Erasing a data subject recomputes the read models that may have copied its personal values: the domain
says which (those handling an event type with a ``Personal`` field), ``erase`` rebuilds them in the same call
(a running ``commitline project`` yields to the swap), and afterwards their rows show ``{"erased": true}`` for
the erased subject while other subjects and other tenants keep theirs. With ``--no-rebuild`` / ``rebuild=False``
the erasure names those read models and the exact command that recomputes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from uuid import UUID

import orjson
import psycopg
import pytest

from commitline.composition import Commitline, bootstrap
from tests.domains import customers
from tests.support import settings_for, wait_for

pytestmark = pytest.mark.integration
APP = "tests.domains.customers:domain"
ERASED_TEXT = '{"erased": true}'
PEOPLE = (("acme", "c-1", "ann@acme.test"), ("acme", "c-2", "bob@acme.test"), ("globex", "c-1", "ann@globex.test"))


@pytest.fixture
def customers_app(pg_dsn: str, schema: str) -> Iterator[Commitline]:
    with bootstrap(settings_for(pg_dsn, schema), domain=customers.domain) as app:
        yield app


def register(app: Commitline, people: tuple[tuple[str, str, str], ...] = PEOPLE) -> dict[tuple[str, str], UUID]:
    return {(tenant, cid): app.dispatch({"type": "register_customer", "customer_id": cid, "email": email},
                                        idempotency_key=f"register-{cid}", tenant=tenant).aggregate_id
            for tenant, cid, email in people}


def contacts(pg_dsn: str, schema: str) -> dict[tuple[str, str], str | None]:
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f'SELECT tenant, customer_id, email FROM "{schema}".rm_customer_contacts').fetchall()
    return {(tenant, cid): email for tenant, cid, email in rows}


def cli(pg_dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema, "COMMITLINE_APP": APP}
    return subprocess.run([sys.executable, "-m", "commitline.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_erase_rebuilds_the_read_model_that_copies_the_subjects_email(customers_app: Commitline, pg_dsn: str,
                                                                       schema: str) -> None:
    app = customers_app
    register(app)
    app.rebuild("customer_contacts")
    assert contacts(pg_dsn, schema) == {(t, c): e for t, c, e in PEOPLE}

    report = app.erase("acme", "c-1", by="the test")

    assert [(e.tenant, e.subject) for e in report] == [("acme", "c-1")]
    assert report.read_models == {"customer_contacts": ("CustomerRegistered.email",)}
    assert [r.projection for r in report.rebuilt] == ["customer_contacts"] and report.recompute is None
    assert contacts(pg_dsn, schema) == {("acme", "c-1"): ERASED_TEXT, ("acme", "c-2"): "bob@acme.test",
                                        ("globex", "c-1"): "ann@globex.test"}
    with psycopg.connect(pg_dsn) as conn:  # the row keyed by the erased email is gone, the others stay
        by_email = conn.execute(f'SELECT tenant, email FROM "{schema}".rm_customers_by_email').fetchall()
    assert sorted(by_email) == [("acme", "bob@acme.test"), ("globex", "ann@globex.test")]

    register(app, (("acme", "c-3", "cy@acme.test"),))
    app.erase("acme", "c-3", by="the test")  # a second erased subject's row does not merge with the first's
    assert contacts(pg_dsn, schema)[("acme", "c-3")] == ERASED_TEXT
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".rm_customers_by_email').fetchone() == (2,)


def test_without_the_rebuild_the_erasure_names_what_may_still_hold_the_values(customers_app: Commitline,
                                                                                pg_dsn: str, schema: str) -> None:
    app = customers_app
    register(app)
    app.rebuild("customer_contacts")

    report = app.erase("acme", "c-1", rebuild=False)

    assert len(report) == 1 and report.rebuilt == ()
    assert report.pending == ("customer_contacts",)
    assert report.recompute == "commitline projections rebuild customer_contacts --fresh"
    assert contacts(pg_dsn, schema)[("acme", "c-1")] == "ann@acme.test"  # what the report warns of
    again = app.erase("acme", "c-1")  # no key left: nothing erased, but the rebuild finishes the erasure
    assert len(again) == 0 and [r.projection for r in again.rebuilt] == ["customer_contacts"]
    assert contacts(pg_dsn, schema)[("acme", "c-1")] == ERASED_TEXT


@pytest.mark.parametrize("master_key", ["missing", "wrong"])
def test_an_erasure_that_could_not_rebuild_for_want_of_the_master_key_erases_nothing(
        customers_app: Commitline, pg_dsn: str, schema: str, master_key: str) -> None:
    """The rebuild opens the other subjects' values: without the master key that wrapped them it cannot run, so
    the erasure is refused before the subject's key is deleted, and its error's "nothing was written" holds."""
    from commitline import ConfigurationError
    from commitline.infrastructure.personal.master import generate

    register(customers_app)
    customers_app.rebuild("customer_contacts")
    settings = settings_for(pg_dsn, schema, master_key=None if master_key == "missing" else generate())
    with bootstrap(settings, domain=customers.domain) as misconfigured:
        with pytest.raises(ConfigurationError) as refused:
            misconfigured.erase("acme", "c-1")
    assert "nothing was written" in str(refused.value)
    assert customers_app.erasures() == []
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".data_keys').fetchone() == (3,)
        assert conn.execute(f'SELECT count(*) FROM "{schema}".follower_positions WHERE name LIKE %s',
                            ("%@rebuild",)).fetchone() == (0,)
    assert contacts(pg_dsn, schema)[("acme", "c-1")] == "ann@acme.test"  # and the erasure, done right, erases
    assert len(customers_app.erase("acme", "c-1")) == 1
    assert contacts(pg_dsn, schema)[("acme", "c-1")] == ERASED_TEXT


def test_an_interrupted_rebuild_from_before_the_erasure_is_not_resumed(customers_app: Commitline, pg_dsn: str,
                                                                        schema: str) -> None:
    app = customers_app
    register(app)  # acme c-1 first: the interrupted rebuild copied its email in its first batch

    class Interrupted(Exception):
        pass

    def interrupt(*_: int) -> None:
        raise Interrupted

    with pytest.raises(Interrupted):
        app.rebuild("customer_contacts", batch_size=1, progress=interrupt)
    with psycopg.connect(pg_dsn) as conn:
        (left,) = conn.execute(f'SELECT email FROM "{schema}".rm_customer_contacts__next').fetchone()
    assert left == "ann@acme.test"  # it would resume from there

    app.erase("acme", "c-1")

    assert contacts(pg_dsn, schema) == {("acme", "c-1"): ERASED_TEXT, ("acme", "c-2"): "bob@acme.test",
                                        ("globex", "c-1"): "ann@globex.test"}


def test_erase_from_the_command_line_while_the_projector_runs(customers_app: Commitline, pg_dsn: str,
                                                              schema: str) -> None:
    app = customers_app
    register(app)
    env = {**os.environ, "COMMITLINE_DATABASE_URL": pg_dsn, "COMMITLINE_SCHEMA": schema, "COMMITLINE_APP": APP}
    project = subprocess.Popen([sys.executable, "-m", "commitline.cli", "project", "customer_contacts"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: project.poll() is not None or len(contacts_or_none(pg_dsn, schema)) == 3,
                 "the projector to copy the three emails")
        assert project.poll() is None, project.stderr.read()[-2000:] if project.stderr else ""

        kept = cli(pg_dsn, schema, "erase", "--tenant", "globex", "--subject", "c-1", "--no-rebuild")
        assert kept.returncode == 0, kept.stderr
        assert "may still show the subject's values" in kept.stdout
        assert "`commitline projections rebuild customer_contacts --fresh`" in kept.stdout
        assert "CustomerRegistered.email" in kept.stdout
        assert contacts(pg_dsn, schema)[("globex", "c-1")] == "ann@globex.test"

        erased = cli(pg_dsn, schema, "erase", "--tenant", "acme", "--subject", "c-1", "--json")
        assert erased.returncode == 0, erased.stderr
        out = orjson.loads(erased.stdout)
        assert out["rebuilt"] == ["customer_contacts"] and out["recompute"] is None
        assert out["read_models"] == {"customer_contacts": ["CustomerRegistered.email"]}
        rows = contacts(pg_dsn, schema)
        assert rows[("acme", "c-1")] == ERASED_TEXT and rows[("acme", "c-2")] == "bob@acme.test"
        assert rows[("globex", "c-1")] == ERASED_TEXT  # erased before without a rebuild: this one covers it

        # the live projector took its lease back after the swap: it copies what comes next
        register(app, (("acme", "c-3", "cy@acme.test"),))
        wait_for(lambda: contacts(pg_dsn, schema).get(("acme", "c-3")) == "cy@acme.test",
                 "the live projector to go on after the rebuild")
        assert project.poll() is None
    finally:
        project.send_signal(signal.SIGTERM)
        project.wait(30)


def contacts_or_none(pg_dsn: str, schema: str) -> dict[tuple[str, str], str | None]:
    try:
        return contacts(pg_dsn, schema)
    except psycopg.errors.UndefinedTable:  # the projector has not created its table yet
        return {}


def test_a_recompute_that_fails_unexpectedly_is_a_failed_rebuild_not_a_crash(customers_app: Commitline,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A read model's write failing for a reason of its own code: the erasure stands, and the failure comes as a
    ``RebuildError`` (the CLI's exit 1 with the command to run again, HTTP's 503 ``erasure_incomplete``)."""
    from commitline.composition import RebuildError

    app = customers_app
    register(app)

    def failing(*args: object, **kwargs: object) -> None:
        raise TypeError("cannot adapt type 'Erased'")

    monkeypatch.setattr(app, "rebuild_many", failing)
    with pytest.raises(RebuildError, match="^TypeError: cannot adapt"):
        app.erase("acme", "c-1", by="the test")
    assert [(e.tenant, e.subject) for e in app.erasures("acme")] == [("acme", "c-1")]  # the erasure itself stands


def test_an_erasure_whose_recompute_meets_a_key_it_cannot_open_says_what_was_erased_without_a_traceback(
        customers_app: Commitline, pg_dsn: str, schema: str) -> None:
    """Mid-rotation, a process with the old key alone can open the data keys wrapped under it but not those a
    process with the new key made: its erasure's recompute fails typed. The CLI says whether anything was erased
    (here nothing: the subject has no key), names the failure and the command to run again, prints the JSON it
    was asked for and no traceback."""
    from commitline.infrastructure.personal.master import generate
    from tests.support import MASTER_KEY

    register(customers_app, PEOPLE[:1])
    new = generate()
    with bootstrap(settings_for(pg_dsn, schema, master_key=new, previous_master_key=MASTER_KEY),
                   domain=customers.domain) as rolled:
        register(rolled, PEOPLE[1:2])
    for extra in ((), ("--json",)):
        done = cli(pg_dsn, schema, "erase", "--tenant", "nosuch", "--subject", "nobody", *extra)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("tenant nosuch has no data key for subject nobody (it never had one, or it was "
                                      "erased before): nothing was erased now, but recomputing the read models "
                                      "customer_contacts failed: COMMITLINE_MASTER_KEY: data key "), done.stderr
        assert "is wrapped under master key" in done.stderr
        assert "run `commitline projections rebuild customer_contacts --fresh`" in done.stderr
        assert new not in done.stderr + done.stdout and MASTER_KEY not in done.stderr + done.stdout
        if extra:
            out = orjson.loads(done.stdout)
            assert out["erased"] == [] and out["rebuilt"] == [] and out["recompute"].startswith("commitline ")
        else:
            assert done.stdout == ""
    assert customers_app.erasures("nosuch") == []
