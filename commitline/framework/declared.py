"""What a domain holds and where it was declared: the record of one declaration, the place of a declaration in
the team's source (for the checks' messages), and the id a command without one of its own gets."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID

T = TypeVar("T")


def call_site(depth: int = 2) -> str:
    """``file:line`` of the caller ``depth`` frames up, relative to the working directory when inside it."""
    frame = sys._getframe(depth)
    return f"{shown_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def shown_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


@dataclass(frozen=True)
class Declared(Generic[T]):
    """Something a domain holds, and where it was declared."""

    value: T
    where: str


def derived_id(command: Any) -> UUID | None:
    """No id of its own: derived from the tenant and the idempotency key."""
    return None
