"""Choosing a domain: ``--app module:attribute`` or ``COMMITLINE_APP``, the convention uvicorn and Celery use.

The module is imported with the working directory first on ``sys.path`` (as uvicorn's ``--app-dir .``),
so a team's package beside the shell works without installing it. The attribute may be dotted
(``module:holder.domain``). With no choice made, the built-in examples run (``DEFAULT_APP``).

Every way the path can be wrong raises ``InvalidApp`` naming it: not ``module:attribute``, a module that
does not import (with the error it raised and where, never a traceback), an attribute it lacks, or
something that is not a ``Domain``. The domain is then checked (``Domain.check``: ``InvalidDomain``).
"""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import traceback

from commitline.application.errors import InvalidApp, InvalidDomain
from commitline.framework.declared import shown_path
from commitline.framework.domain import Domain

DEFAULT_APP = "commitline.examples:domain"
APP_VARIABLE = "COMMITLINE_APP"


def load_domain(spec: str | None = None, *, variable: str = APP_VARIABLE) -> Domain:
    """The checked domain ``spec`` names (None: the built-in examples); ``variable`` is how the caller gave it
    (``--app`` or ``COMMITLINE_APP``), for the error."""
    spec = DEFAULT_APP if spec is None else spec.strip()
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise InvalidApp(variable, spec, "must be module:attribute, e.g. shelfwise.app:domain (the module to import "
                         "and the name of its Domain)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except SystemExit as e:
        raise InvalidApp(variable, spec, f"importing {module_name} exited (sys.exit({e.code!r}))") from None
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise InvalidApp(variable, spec, f"there is no module {e.name!r} (importable from {cwd} or the "
                             "installed packages)") from None
        raise InvalidApp(variable, spec, f"importing {module_name} failed: {_described(e)}") from None
    except Exception as e:
        raise InvalidApp(variable, spec, f"importing {module_name} failed: {_described(e)}") from None
    value: object = module
    for n, part in enumerate(attribute.split(".")):
        if not hasattr(value, part):
            held = ".".join([module_name, *attribute.split(".")[:n]])
            kind = "module" if n == 0 else "attribute"
            raise InvalidApp(variable, spec, f"{kind} {held} has no attribute {part!r}{_where(module)}") from None
        value = getattr(value, part)
    if not isinstance(value, Domain):
        kind = "a class" if isinstance(value, type) else f"an object of type {type(value).__name__}"
        raise InvalidApp(variable, spec, f"{attribute} is {kind}, not a commitline Domain (Domain(\"name\") from "
                         "`from commitline import Domain`)")
    value.loaded_as = (variable, spec)
    try:
        return value.check()
    except InvalidDomain as e:
        raise InvalidDomain(variable, e.domain, e.problems, spec) from None


def _where(module: object) -> str:
    """Where a module was imported from, when that may surprise: a folder without ``__init__.py`` (a namespace
    package, say the project's own folder in the working directory, hiding the installed package)."""
    if getattr(module, "__file__", None) is None:
        paths = ", ".join(getattr(module, "__path__", []) or [])
        return (f" (it was imported from the folder {paths}, which has no __init__.py: run commitline from the "
                "folder that holds the package, or install it)")
    return ""


#: Where Python's own modules, installed packages and commitline live: a frame there is not the team's code.
_NOT_THE_TEAMS = tuple(sorted({*(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
                               os.path.dirname(os.path.dirname(__file__))}))


def _described(error: BaseException) -> str:
    """The error and the innermost place of the importing code it came from: of the team's code if it passed
    there (a ``@dataclass`` event fails inside ``dataclasses.py``, on the team's line); a syntax error: its line."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"SyntaxError: {error.msg} ({shown_path(error.filename)}:{error.lineno})"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "importlib" not in f.filename]
    teams = [f for f in frames if not os.path.abspath(f.filename).startswith(_NOT_THE_TEAMS)]
    inside = teams or frames
    place = f" ({shown_path(inside[-1].filename)}:{inside[-1].lineno})" if inside else ""
    return f"{type(error).__name__}: {error}{place}"
