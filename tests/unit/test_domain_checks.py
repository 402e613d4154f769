"""A domain is checked when it is loaded: every contradiction among its declarations is refused at once, in one
message naming each and where it is declared (no I/O: this is before anything could be written)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from uuid import UUID

import pytest

from commitline import Aggregate, Command, Domain, Event, InvalidDomain, Stream
from tests.domains import contradictions

SOURCE = Path(contradictions.__file__).read_text().splitlines()


def marked(name: str) -> int:
    """The line of ``contradictions.py`` marked ``# <- name``."""
    return next(n for n, line in enumerate(SOURCE, start=1) if line.rstrip().endswith(f"# <- {name}"))


def problems() -> list[str]:
    with pytest.raises(InvalidDomain) as refused:
        contradictions.domain.check()
    return list(refused.value.problems)


def test_every_contradiction_is_listed_in_one_error() -> None:
    found = problems()
    message = str(InvalidDomain(domain="contradictions", problems=found))
    assert message.startswith(f"domain 'contradictions' cannot be used: {len(found)} problems:")
    assert all(f"  - {p}" in message for p in found)
    kinds = {
        "two commands with one type name": r"two commands have the type 'switch_lamp'",
        "two events with one type name": r"two events have the type name Switched",
        "a handler for an aggregate not held": r"the handler of Glow changes Unheld, an aggregate the domain does "
                                               r"not hold",
        "a table naming unknown states": r"transition table: targets 'AMBER', GREEN have no row",
        "a read model of an event no aggregate emits": r"read model brightness handles Dimmed, which no aggregate",
        "an upcaster chain with a hole": r"upcaster chain has a hole: it is at class_version 3 and lacks upcast_v2_v3",
        "an error without its HTTP status": r"error Broken needs an HTTP status",
        "a key that is not a column": r"read model glows's table rm_glows: key column 'lamp' is not one of its "
                                      r"columns \(lamp_id, n\)",
        "a counter that is not a column": r"rm_glows: counter 'nn' is not one of its columns",
        "a counter that is a key column": r"rm_glows: 'lamp_id' is a key column and a counter",
    }
    for kind, pattern in kinds.items():
        assert any(re.search(pattern, p) for p in found), f"{kind} not reported in {found}"


@pytest.mark.parametrize(("pattern", "mark"), [
    (r"two commands have the type 'switch_lamp'", "command type twice"),
    (r"the handler of Glow changes Unheld", "aggregate not held"),
    (r"upcaster chain has a hole", "upcaster hole"),
    (r"read model brightness handles Dimmed", "event no aggregate emits"),
    (r"error Broken needs an HTTP status", "error without status"),
    (r"two events have the type name Switched", "event type twice"),
    (r"key column 'lamp' is not one of its columns", "table of unknown columns"),
])
def test_each_problem_names_the_file_and_line_it_is_declared_at(pattern: str, mark: str) -> None:
    problem = next(p for p in problems() if re.search(pattern, p))
    path, line = re.match(r"^(\S+?):(\d+): ", problem).groups()  # type: ignore[union-attr]
    assert path.endswith("tests/domains/contradictions.py")
    assert abs(int(line) - marked(mark)) <= 1, (problem, marked(mark))


def test_a_sound_domain_passes_and_is_checked_again_after_a_new_declaration() -> None:
    domain = Domain("lights")

    class Lit(Event):
        pass

    @domain.aggregate
    class Bulb(Aggregate):
        EVENTS = (Lit,)

        def _evolve(self, event: Event) -> None:
            pass

    class Light(Command):
        bulb_id: str

    assert domain.check() is domain
    domain.handles(Light, Bulb, Stream.EXISTING, id="wattage")(lambda bulb, command: None)
    with pytest.raises(InvalidDomain, match="takes the aggregate id from field 'wattage', which Light does not have"):
        domain.check()


def test_a_command_on_an_existing_stream_must_say_where_its_id_is() -> None:
    domain = Domain("switches")

    class Flipped(Event):
        pass

    @domain.aggregate
    class Switch(Aggregate):
        EVENTS = (Flipped,)

        def _evolve(self, event: Event) -> None:
            pass

    class Flip(Command):
        switch_id: str

    domain.handles(Flip, Switch)(lambda switch, command: None)
    with pytest.raises(InvalidDomain, match="the handler of Flip names no id"):
        domain.check()


def test_a_domain_made_of_parts_sees_what_a_part_declares_later() -> None:
    part, whole = Domain("part"), Domain("whole")
    whole.include(part)

    class Rang(Event):
        pass

    @part.aggregate
    class Bell(Aggregate):
        EVENTS = (Rang,)

    with pytest.raises(InvalidDomain, match="aggregate Bell does not implement _evolve"):
        whole.check()


def test_the_examples_are_a_sound_domain() -> None:
    from commitline.examples import domain

    assert domain.check() is domain
    assert {h.command.type_name() for h in domain.catalog.handlers.values() if h.internal} >= {
        "start_fulfilment", "park_fulfilment", "retry_fulfilment"}


def test_a_command_type_is_the_class_name_in_snake_case_unless_declared() -> None:
    class PlaceTradeNow(Command):
        portfolio_id: str

    class ABCRefund(Command):
        pass

    assert PlaceTradeNow.type_name() == "place_trade_now" and PlaceTradeNow(portfolio_id="p").type == "place_trade_now"
    assert ABCRefund.type_name() == "abc_refund"


def test_every_extra_declaration_of_a_name_is_reported_in_the_order_declared() -> None:
    domain = Domain("bells")

    class Rung(Event):
        pass

    @domain.aggregate
    class Bell(Aggregate):
        EVENTS = (Rung,)

        def _evolve(self, event: Event) -> None:
            pass

    class Ring(Command):
        bell_id: str

    class RingAgain(Command):
        type: Literal["ring"] = "ring"
        bell_id: str

    class RingOnceMore(Command):
        type: Literal["ring"] = "ring"
        bell_id: str

    for command in (Ring, RingAgain, RingOnceMore):
        domain.handles(command, Bell, id="bell_id")(lambda bell, command: None)
    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    twice = [p for p in refused.value.problems if "two commands have the type 'ring'" in p]
    assert len(twice) == 2
    assert refused.value.problems == sorted(refused.value.problems, key=lambda p: (
        p.split(":")[0], int(p.split(":")[1])))


def test_an_error_whose_message_names_what_it_does_not_have_is_refused() -> None:
    from commitline import DomainError

    domain = Domain("refusals")

    @domain.error
    class Nope(DomainError):
        code, status, fields = "nope", 409, ("thing_id",)
        message = "thing {thing} refused ({thing_id})"

    @domain.error
    class Fine(DomainError):
        code, status, fields = "fine", 409, ("thing_id",)
        message = "thing {thing_id} refused: {why}"

        @property
        def why(self) -> str:
            return "because"

    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    (problem,) = refused.value.problems
    assert "error Nope's message names thing: not one of its fields (thing_id)" in problem
    assert str(Fine("t-1")) == "thing t-1 refused: because"


def test_a_state_field_of_another_enum_is_found_without_postponed_annotations() -> None:
    from tests.domains import plain_annotations

    with pytest.raises(InvalidDomain) as refused:
        plain_annotations.domain.check()
    assert any("aggregate Gate's field state is Door | None, but its transition table's states are Lock members" in p
               for p in refused.value.problems), refused.value.problems


def test_an_event_dict_keyed_by_anything_but_strings_is_refused_naming_the_field() -> None:
    from tests.domains import keyed

    with pytest.raises(InvalidDomain) as refused:
        keyed.domain.check()
    found = [p for p in refused.value.problems if "keyed by" in p]
    assert sorted(re.sub(r"^\S+: ", "", p) for p in found) == [
        "event Measured's field by_level holds a dict keyed by Level: an event is stored as JSON, whose object keys "
        "are strings; key it by str",
        "event Measured's field history holds a dict keyed by UUID: an event is stored as JSON, whose object keys "
        "are strings; key it by str"]
    assert all(p.startswith("tests/domains/keyed.py:") for p in found), found


def test_an_event_field_of_the_envelopes_name_and_an_unusable_error_code_are_refused() -> None:
    from commitline import DomainError

    domain = Domain("drafts")

    class Drafted(Event):
        version: int  # every event has a version already: emitting this one could only fail
        title: str

    @domain.aggregate
    class Draft(Aggregate):
        EVENTS = (Drafted,)

        def _evolve(self, event: Event) -> None:
            pass

    @domain.error
    class Odd(DomainError):
        code = "Weird Code!"
        status = 409

    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    found = refused.value.problems
    assert any("event Drafted declares version, which every event has already" in p for p in found), found
    assert any("error Odd's code 'Weird Code!' is not a usable code" in p for p in found), found


def test_a_problem_whose_text_holds_braces_is_shown_as_it_is() -> None:
    refused = InvalidDomain(domain="slots", problems=["slots.py:9: two queries have the path slots/{slot_id}"])
    assert str(refused).endswith("  - slots.py:9: two queries have the path slots/{slot_id}")


def test_a_domain_named_like_postgresqls_own_schemas_is_refused() -> None:
    with pytest.raises(InvalidDomain, match="the domain's schema 'pg_temp' begins with pg_"):
        Domain("pg_temp").check()
    with pytest.raises(InvalidDomain, match="the domain's schema 'order' is a PostgreSQL keyword"):
        Domain("order").check()  # written unquoted by eventsourcing: every command would fail with a syntax error
    assert Domain("order", schema="orders").check().schema == "orders"


def test_an_aggregate_that_redefines_commitlines_own_names_or_has_a_field_without_default_is_refused() -> None:
    """``apply`` and ``replay`` are natural names in a lending domain, and ``version`` in many: each would replace
    what commitline applies events with, or keeps the stream's version in, and every command would fail far from
    the cause. A field without a default leaves nothing to build the aggregate from before its first event."""
    domain = Domain("lending")

    class Applied(Event):
        pass

    @domain.aggregate
    class Loan(Aggregate):
        version: str = "v1"  # type: ignore[assignment]
        borrower: str

        EVENTS = (Applied,)

        def apply(self, principal: str) -> None:  # type: ignore[override]
            pass

        @classmethod
        def replay(cls, loan_id: str) -> None:  # type: ignore[override]
            pass

        def _evolve(self, event: Event) -> None:
            pass

    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    found = refused.value.problems
    assert any("aggregate Loan defines apply, replay, version, which are commitline's own" in p for p in found), found
    assert any("aggregate Loan's field borrower has no default" in p for p in found), found

    sound = Domain("ledger")

    @sound.aggregate
    class Account(Aggregate):  # the id declared again as it is, and a blank() of its own: both fine
        id: UUID
        owner: str

        EVENTS = (Applied,)

        @classmethod
        def blank(cls, aggregate_id: UUID) -> Account:
            return cls(id=aggregate_id, owner="nobody")

        def _evolve(self, event: Event) -> None:
            pass

    assert sound.check() is sound


def test_two_aggregates_of_one_name_in_one_file_are_each_named_at_their_own_line() -> None:
    domain = Domain("tickets")

    class Held(Event):
        pass

    class Booked(Event):
        pass

    @domain.aggregate
    class Ticket(Aggregate):
        EVENTS = (Held,)

        def _evolve(self, event: Event) -> None:
            pass

    first = Ticket

    @domain.aggregate  # type: ignore[no-redef]
    class Ticket(Aggregate):  # noqa: F811
        EVENTS = (Booked,)

        def _evolve(self, event: Event) -> None:
            pass

    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    (problem,) = [p for p in refused.value.problems if "two aggregates are named Ticket" in p]
    lines = [n for n, line in enumerate(Path(__file__).read_text().splitlines(), start=1)
             if line.strip().startswith("class Ticket(Aggregate):")]
    assert first is not Ticket and len(lines) == 2
    assert f"test_domain_checks.py:{lines[1]}: two aggregates are named Ticket (also " in problem, problem
    assert f"test_domain_checks.py:{lines[0]}): the name is the stored aggregate type" in problem, problem


def test_a_read_model_table_a_rebuild_would_drop_or_cannot_name_is_refused() -> None:
    """A rebuild drops a read model's tables and swaps ``<name>__next`` in: a table named like one of the store's own
    (``data_keys``, ``api_keys``, ``events``) would lose the store's rows, and a name too long for the suffix would
    be truncated back to the live table's by PostgreSQL."""
    from commitline import Projection, Table, on

    domain = Domain("lamps")

    class Lit(Event):
        pass

    @domain.aggregate
    class Lamp(Aggregate):
        EVENTS = (Lit,)

        def _evolve(self, event: Event) -> None:
            pass

    def read_model(name: str, table: str) -> None:
        @domain.read_model
        class Model(Projection):
            tables = (Table(table, {"id": "uuid"}, key=("id",)),)

            @on(Lit)
            def lit(self, changes: object, recorded: object) -> None:
                pass

        Model.name = name

    read_model("stolen_keys", "data_keys")
    read_model("long", "x" * 58)
    read_model("suffixed", "rm_lamps__next")
    read_model("sagas", "rm_sagas")
    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    said = str(refused.value)
    assert "read model stolen_keys's table 'data_keys' is one of the store's own tables" in said
    assert f"read model long's table '{'x' * 58}' must be lowercase letters" in said and "at most 57" in said
    assert "ends with '__next', the suffix of a rebuild's tables" in said
    assert "is named 'sagas', a name another follower uses" in said


def test_every_table_of_a_fresh_store_is_among_those_read_models_may_not_name() -> None:
    from commitline.infrastructure import migrations

    created = set()
    for migration in migrations.MIGRATIONS:
        for statement in migration.statements("s"):
            text = statement.as_string(None) if hasattr(statement, "as_string") else str(statement)
            created |= set(re.findall(r'CREATE TABLE IF NOT EXISTS "?s"?\."?([a-z_]+)"?', text))
    assert created and created <= migrations.STORE_TABLES, created - migrations.STORE_TABLES


class NotAType:
    """No request parameter can be one (pydantic has no schema for it)."""


def test_a_query_path_no_request_can_reach_as_declared_is_refused() -> None:
    """Unbalanced braces, spaces, an empty path or a '?' were served as they stood (or not at all); two paths of one
    shape answered the same URLs (the first won); a placeholder named twice, or a parameter type pydantic cannot
    read, failed only when ``serve`` started."""
    domain = Domain("shelves")

    def read(reads: object, tenant: str, shelf_id: str = "", a: str = "", other: str = "") -> None:
        return None

    def odd(reads: object, tenant: str, shelf_id: NotAType) -> None:
        return None

    domain.query("shelves/{shelf_id")(read)
    domain.query("has space/x")(read)
    domain.query("")(read)
    domain.query("a?b=1")(read)
    domain.query("y/{a}/{a}")(read)
    domain.query("shelves/{shelf_id}")(read)
    domain.query("shelves/{other}")(read)
    domain.query("odd/{shelf_id}")(odd)
    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    said = str(refused.value)
    for path in ("shelves/{shelf_id", "has space/x", "", "a?b=1"):
        assert f"path {path!r} must be segments separated by '/'" in said, path
    assert "path names {a} twice" in said
    assert "two queries are served at /v1/read-models/shelves/{other}" in said
    assert "query odd's parameter 'shelf_id' has a type no request can give" in said


def test_a_counter_of_text_and_a_prefetch_of_another_table_are_refused() -> None:
    """Both failed at the first batch, in the write (a traceback that stopped every read model of the process)."""
    from commitline import Projection, Table, on

    domain = Domain("tallies")

    class Counted(Event):
        pass

    @domain.aggregate
    class Tally(Aggregate):
        EVENTS = (Counted,)

        def _evolve(self, event: Event) -> None:
            pass

    @domain.read_model
    class Tallies(Projection):
        name = "tallies"
        tables = (Table("rm_tallies", {"id": "uuid", "n": "text"}, key=("id",), counters=("n",)),)
        prefetch = {"rm_typo": lambda recorded: (recorded.event.aggregate_id,)}

        @on(Counted)
        def counted(self, changes: object, recorded: object) -> None:
            pass

    with pytest.raises(InvalidDomain) as refused:
        domain.check()
    said = str(refused.value)
    assert "counter 'n' is of type 'text', which cannot be added to" in said
    assert "read model tallies prefetches rows of 'rm_typo', not one of its tables (rm_tallies)" in said


@pytest.mark.parametrize(("handler", "named"), [
    (lambda account: None, r"takes \(account\), which two or three positional arguments cannot call"),
    (lambda account, command, load, extra: None, r"takes \(account, command, load, extra\), which two or three "
                                                 r"positional arguments cannot call"),
    ("not a function", r"is 'not a function', which cannot be called"),
])
def test_a_handler_that_cannot_be_called_with_the_aggregate_and_the_command_is_named_at_load(
        handler: object, named: str) -> None:
    domain = Domain("ledgers")

    class Opened(Event):
        pass

    @domain.aggregate
    class Ledger(Aggregate):
        EVENTS = (Opened,)

        def _evolve(self, event: Event) -> None:
            pass

    class Close(Command):
        ledger_id: str

    domain.handles(Close, Ledger, id="ledger_id")(handler)  # type: ignore[arg-type]
    with pytest.raises(InvalidDomain, match=f"the handler of Close {named}: it is called with the aggregate and the "
                                            "command"):
        domain.check()


def test_a_handler_with_a_keyword_only_option_is_called_without_the_loader() -> None:
    from commitline.application.catalog import with_loader

    calls = []
    run = with_loader(lambda aggregate, command, *, note="": calls.append((aggregate, command, note)))
    run("ledger", "close", "the loader")
    assert calls == [("ledger", "close", "")]


def test_an_event_field_its_json_cannot_store_is_refused_at_load_naming_the_field_and_the_type() -> None:
    from tests.domains import unstorable

    with pytest.raises(InvalidDomain) as refused:
        unstorable.domain.check()
    found = {re.sub(r"^\S+: event Filed's field (\w+) holds (.+?), which an event's JSON cannot store.*$", r"\1 \2", p)
             for p in refused.value.problems if "cannot store and read back" in p}
    assert found == {"digest bytes", "phase complex", "wait timedelta", "blob Blob", "note Note",
                     "attachments bytes"}, refused.value.problems
    assert all(p.startswith("tests/domains/unstorable.py:") for p in refused.value.problems), refused.value.problems
