"""``commitline init PATH``: a new service package with its own domain, written from the templates in
``service/`` (package data): one aggregate with its transition table, two commands with their handlers, one
read model, given/when/then specifications (``commitline.testing``) and a README with the commands to run it.

The package is named after the folder; ``${package}`` in a template stands for that name.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from importlib import resources
from pathlib import Path
from string import Template
from commitline.infrastructure.schema_names import schema_name_problem

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
#: template (under ``service/``) -> where it goes (``{package}`` is the package's name)
FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "package/__init__.py.tmpl": "{package}/__init__.py",
    "package/refunds.py.tmpl": "{package}/refunds.py",
    "package/read_models.py.tmpl": "{package}/read_models.py",
    "tests/test_refunds.py.tmpl": "tests/test_refunds.py",
}


_TEST_FOLDERS = frozenset({"tests", "test"})


class ScaffoldRefused(ValueError):
    """The folder cannot take a new service (its name is no package name, or it holds files already)."""


def package_name(path: Path) -> str:
    name = path.resolve().name.replace("-", "_")
    if not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ScaffoldRefused(f"{path.name!r} cannot name a Python package (and a database schema): use lowercase "
                              "letters, digits and '_' (or '-'), starting with a letter or '_', at most 41 characters")
    if name in _TEST_FOLDERS:
        raise ScaffoldRefused(f"{path.name!r} cannot name the package: the service has a folder {name!r} of its own "
                              "(its tests), which pytest and Python would mix up with it; choose another name")
    if name in sys.stdlib_module_names or _installed(name):
        raise ScaffoldRefused(f"{path.name!r} is the name of a module Python already has ({name}, "
                              f"{'in its standard library' if name in sys.stdlib_module_names else 'installed'}): "
                              "a package of that name would hide it or be hidden by it; choose another name")
    if name == "public":
        wrong: str | None = ("is PostgreSQL's default schema, shared by whatever else uses the database: the "
                             "domain's store would mix with it")
    else:
        wrong = schema_name_problem(name)
    if wrong is not None:  # the package's name is its store's schema
        raise ScaffoldRefused(f"{path.name!r} cannot name a package: it is also its database schema's name, and "
                              f"{name!r} {wrong}; choose another name")
    return name


def _installed(name: str) -> bool:
    """A module of that name is importable here (a folder without code, such as an empty one of that name in the
    working directory, is a namespace package, not a module in the way)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def write_service(path: Path) -> tuple[str, list[Path]]:
    """Write a new service package into ``path`` (created if missing, refused if it holds anything); returns
    the package's name and the files written."""
    name = package_name(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ScaffoldRefused(f"{path} already exists and is not an empty folder: nothing was written")
    templates = resources.files(__package__) / "service"
    written = []
    for template, target in FILES.items():
        destination = path / target.format(package=name)
        text = Template((templates / template).read_text(encoding="utf-8")).substitute(package=name)
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(text, encoding="utf-8")
        written.append(destination)
    return name, written
