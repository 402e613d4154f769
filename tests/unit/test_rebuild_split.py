"""How ``rebuild_many(..., jobs=N)`` splits projections between processes."""

from __future__ import annotations

from commitline.composition.rebuild_workers import split


def test_projections_are_split_into_balanced_groups_heaviest_first() -> None:
    weights = {"a": 60, "b": 50, "c": 40, "d": 30, "e": 0}
    groups = split(weights, 2)
    assert groups == [["a", "d", "e"], ["b", "c"]]  # 90 and 90: the heaviest first, names in order
    assert split(weights, 2) == groups  # always the same split
    assert sorted(n for g in split(weights, 3) for n in g) == sorted(weights)
    assert [sum(weights[n] for n in g) for g in split(weights, 3)] == [70, 60, 50]


def test_never_more_groups_than_projections_nor_an_empty_one() -> None:
    assert split({"a": 5, "b": 0}, 8) == [["a"], ["b"]]
    assert split({"a": 0, "b": 0, "c": 0}, 2) == [["a", "c"], ["b"]]
    assert split({"only": 3}, 4) == [["only"]]
