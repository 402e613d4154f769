"""An event's payload cannot change once the event is made: a list or dict in it is a read-only copy, so an
aggregate that keeps an event's list and appends to it fails at that line instead of changing, before it is
stored, an event it already emitted."""

from __future__ import annotations

import copy
import pickle
from datetime import datetime, timezone
from uuid import UUID, uuid4

import orjson
import pytest

from commitline import Aggregate, Domain, Event
from commitline.infrastructure.store.codec import EventCodec, encode_event


class BasketOpened(Event):
    items: list[str]
    tags: dict[str, list[int]] = None  # type: ignore[assignment]


class ItemAdded(Event):
    item: str


class Checked(Event):
    """An event with a ``__post_init__`` of its own: its payload is frozen before that runs."""

    lines: list[str]
    count: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", len(self.lines))


class Basket(Aggregate):
    """Keeps the first event's list itself: the defect the frozen payload turns into an error."""

    items: list[str] = None  # type: ignore[assignment]

    EVENTS = (BasketOpened, ItemAdded)

    def _evolve(self, event: Event) -> None:
        match event:
            case BasketOpened(items=items):
                self.items = items
            case ItemAdded(item=item):
                self.items.append(item)


class CopyingBasket(Basket):
    """The same domain written right: its own copy of the list."""

    def _evolve(self, event: Event) -> None:
        match event:
            case BasketOpened(items=items):
                self.items = list(items)
            case ItemAdded(item=item):
                self.items.append(item)


def opened(items: list[str], tags: dict[str, list[int]] | None = None) -> BasketOpened:
    return BasketOpened(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                        items=items, tags=tags)


def test_a_list_or_dict_in_a_payload_is_a_read_only_copy_that_reads_compares_and_encodes_as_before() -> None:
    given = ["apple"]
    event = opened(given, {"sizes": [1, 2]})
    given.append("pear")  # the caller's list is not the event's
    assert event.items == ["apple"] and event.tags == {"sizes": [1, 2]}
    for change in (lambda: event.items.append("pear"), lambda: event.items.__setitem__(0, "x"),
                   lambda: event.tags["sizes"].append(3), lambda: event.tags.update(more=[1]),
                   lambda: event.tags.pop("sizes")):
        with pytest.raises(TypeError, match="belongs to an event: an event's payload never changes: copy it first"):
            change()
    items = event.items
    with pytest.raises(TypeError):
        items += ["pear"]
    assert event.items == ["apple"] and event.tags == {"sizes": [1, 2]}
    plain = BasketOpened(**{**event.__dict__})
    assert plain == event and orjson.dumps(event.payload()) == b'{"items":["apple"],"tags":{"sizes":[1,2]}}'
    assert copy.deepcopy(event) == event and pickle.loads(pickle.dumps(event)) == event
    assert list(event.items) + ["pear"] == ["apple", "pear"] and {**event.tags, "x": []} == {"sizes": [1, 2], "x": []}


def test_an_event_with_its_own_post_init_is_frozen_before_it_runs() -> None:
    checked = Checked(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                      lines=["a", "b"])
    assert checked.count == 2
    with pytest.raises(TypeError, match="belongs to an event"):
        checked.lines.append("c")


class Counted(Event):
    """Scalars alone, with a ``__post_init__``; a subclass adds a list."""

    name: str
    length: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", len(self.name))


class CountedWithTags(Counted):
    tags: list[str]


def test_an_event_that_inherits_a_post_init_and_adds_a_list_runs_both() -> None:
    tagged = CountedWithTags(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                             name="abc", tags=["x"])
    assert tagged.length == 3
    with pytest.raises(TypeError, match="belongs to an event"):
        tagged.tags.append("y")


def emit_two(cls: type[Basket]) -> Basket:
    basket = cls.blank(uuid4())
    basket._emit(BasketOpened, items=["apple"])
    basket._emit(ItemAdded, item="pear")
    return basket


def test_an_aggregate_that_appends_to_an_event_s_list_fails_at_that_line_and_the_emitted_event_stays_as_decided(
) -> None:
    basket = Basket.blank(uuid4())
    basket._emit(BasketOpened, items=["apple"])
    with pytest.raises(TypeError, match="belongs to an event"):
        basket._emit(ItemAdded, item="pear")
    (first,) = basket._pending()
    assert first.items == ["apple"], "the event as the command decided it"

    written_right = emit_two(CopyingBasket)
    assert written_right.items == ["apple", "pear"]
    assert [e.payload() for e in written_right._pending()] == [{"items": ["apple"], "tags": None}, {"item": "pear"}]


def test_decoded_events_are_frozen_too_so_a_replay_fails_as_the_command_would() -> None:
    domain = Domain("baskets")
    domain.aggregate(CopyingBasket)
    codec = EventCodec(domain.check().registry)
    stored = encode_event(opened(["apple"], {"sizes": [1]}), "t1")
    back = codec.decode_event(stored.topic, stored.originator_id, 1, stored.state).event
    assert isinstance(back, BasketOpened) and back.items == ["apple"] and isinstance(back.aggregate_id, UUID)
    with pytest.raises(TypeError, match="belongs to an event"):
        back.items.append("pear")
    with pytest.raises(TypeError, match="belongs to an event"):
        back.tags["sizes"].append(2)


def test_an_event_of_a_second_import_of_the_same_file_is_named_as_such() -> None:
    """The same module imported under two names gives two classes of each name: the aggregate of one copy cannot
    apply the other's events, and the refusal says so instead of claiming the event is not in EVENTS."""
    twin = type("BasketOpened", (Event,), {"__annotations__": {"items": list[str]}, "__module__": "copy_of_domain",
                                           "__qualname__": "BasketOpened"})
    event = twin(event_id=uuid4(), aggregate_id=uuid4(), version=1, occurred_at=datetime.now(timezone.utc),
                 items=["apple"])
    with pytest.raises(TypeError, match=r"cannot apply copy_of_domain\.BasketOpened: its EVENTS hold "
                                        r"tests\.unit\.test_event_payloads\.BasketOpened, another class of the same "
                                        r"name \(one file imported as two modules\?"):
        Basket.blank(event.aggregate_id).apply(event)
