"""``commitline init PATH`` names the package after the folder: a name Python cannot import as a new package of
the user's (a keyword, a standard library module, one already installed) is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from commitline.scaffold import ScaffoldRefused, package_name, write_service


def test_a_plain_name_is_the_package_name(tmp_path: Path) -> None:
    assert package_name(tmp_path / "shelf-wise") == "shelf_wise"
    (tmp_path / "booking").mkdir()  # an empty folder of that name beside the working directory is no module
    assert package_name(tmp_path / "booking") == "booking"


@pytest.mark.parametrize(("folder", "reason"), [
    ("calendar", "in its standard library"), ("queue", "in its standard library"), ("json", "in its standard library"),
    ("commitline", "installed"), ("pydantic", "installed"),
])
def test_a_name_python_has_already_is_refused_and_nothing_is_written(tmp_path: Path, folder: str,
                                                                      reason: str) -> None:
    with pytest.raises(ScaffoldRefused, match=f"is the name of a module Python already has .*{reason}"):
        write_service(tmp_path / folder)
    assert not (tmp_path / folder).exists()


@pytest.mark.parametrize("folder", ["class", "9lives", "Shelf"])
def test_a_name_that_is_no_package_name_is_refused(tmp_path: Path, folder: str) -> None:
    with pytest.raises(ScaffoldRefused, match="cannot name a Python package"):
        package_name(tmp_path / folder)


@pytest.mark.parametrize(("folder", "reason"), [
    ("user", "is a PostgreSQL keyword"), ("order", "is a PostgreSQL keyword"), ("pg_toast", "begins with pg_"),
    ("information_schema", "is PostgreSQL's own schema"), ("public", "is PostgreSQL's default schema, shared"),
])
def test_a_name_that_cannot_be_its_schemas_is_refused_and_nothing_is_written(tmp_path: Path, folder: str,
                                                                             reason: str) -> None:
    """The package's name is its store's schema: ``user`` would break every command with a syntax error."""
    with pytest.raises(ScaffoldRefused, match=f"also its database schema's name, and '{folder}' {reason}"):
        write_service(tmp_path / folder)
    assert not (tmp_path / folder).exists()


@pytest.mark.parametrize("folder", ["tests", "test"])
def test_a_name_the_services_own_tests_folder_has_is_refused(tmp_path: Path, folder: str) -> None:
    with pytest.raises(ScaffoldRefused, match=f"has a folder '{folder}' of its own"):
        write_service(tmp_path / folder)
    assert not (tmp_path / folder).exists()


def test_init_with_an_empty_path_is_bad_usage_not_the_working_directory(capsys: pytest.CaptureFixture[str]) -> None:
    from commitline.cli import main

    assert main(["init", ""]) == 2
    assert "PATH is empty" in capsys.readouterr().err
