"""Comparing a projection's declared tables with the stored ones (pure)."""

from __future__ import annotations

from commitline.projections.storage import ProjectionNeedsRebuild, shape_differences

DECLARED = {"rm_a": {"id": "uuid", "n": "int8"}, "rm_b": {"k": "text"}}


def test_no_stored_table_is_a_first_start_and_the_same_shape_is_no_difference() -> None:
    assert shape_differences(DECLARED, {}) == []
    assert shape_differences(DECLARED, {"rm_a": {"n": "int8", "id": "uuid"}, "rm_b": {"k": "text"}}) == []


def test_every_added_removed_or_retyped_column_and_missing_table_is_named() -> None:
    stored = {"rm_a": {"id": "uuid", "n": "int4", "extra": "text"}}
    assert shape_differences(DECLARED, stored) == [
        "rm_a.extra is not declared", "rm_a.n is int4, declared int8", "table rm_b is missing"]
    assert shape_differences(DECLARED, {"rm_a": {"id": "uuid"}, "rm_b": {"k": "text"}}) == ["rm_a.n is missing"]


def test_the_refusal_names_the_projection_the_differences_and_the_command() -> None:
    error = ProjectionNeedsRebuild("p", ["rm_a.n is missing"])
    assert str(error) == ("projection p needs a rebuild: its tables differ from what it declares (rm_a.n is missing); "
                          "run `commitline projections rebuild p`")
    assert error.command == "commitline projections rebuild p"
