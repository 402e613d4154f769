"""The boundary every command crosses, whatever its entry: a model, a mapping, JSON text or bytes (the
CLI, an HTTP body), and the idempotency key and tenant that come with it.

Only JSON values pass: objects with string keys (a ``dict``), arrays (``list`` or ``tuple``), strings,
integers in the signed 64-bit range, finite floats, booleans and ``None``. A Python mapping may also
hold ``UUID`` objects in id fields and ``Decimal`` objects in amount fields (the caller names those
fields); sets, bytes and any other object are refused, never converted with ``str()``. Text may not
contain NUL (PostgreSQL cannot store it) or lone surrogates (not Unicode; what invalid UTF-8 becomes).
Size, string length, list length and nesting depth are bounded by ``CommandLimits``.

Every problem is reported in one ``InvalidCommand`` with its location (keys and list indexes), before
anything is parsed further or stored. The walk is iterative and stops at the limits, so neither deep
nesting nor a huge or self-referential mapping can exhaust the stack or the CPU.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from commitline.application.errors import (
    InvalidCommand,
    InvalidIdempotencyKey,
    InvalidTenant,
    MissingIdempotencyKey,
    printable,
)

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
_OUT_OF_RANGE = (f"integer out of range ({INT_MIN} to {INT_MAX})", "int_range")
MAX_KEY_LENGTH = 255
KEY_WHITE_SPACE = " \t"  # around an idempotency key: never part of it (HTTP's optional white space)
_NOT_KEY = re.compile(r"[^\x20-\x7e]")  # anything but printable ASCII
MAX_PROBLEMS = 50
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")  # NUL or a lone surrogate: text_problem says which
_SCALARS = (int, float, bool, type(None))


@dataclass(frozen=True)
class CommandLimits:
    """Bounds on a command's JSON (configured by the ``COMMITLINE_MAX_*`` settings)."""

    max_bytes: int = 16 * 1024 * 1024
    """the command as JSON, in UTF-8 bytes: enough for a command naming 100,000 ids"""
    max_string_length: int = 4096
    """any string, object keys included, in characters (fields have their own, lower limits)"""
    max_list_length: int = 100_000
    """any list"""
    max_depth: int = 8
    """objects and lists nested in each other, the command itself being the first level"""


DEFAULT_LIMITS = CommandLimits()


def problem(loc: list[str | int], msg: str, kind: str) -> dict[str, Any]:
    return {"loc": loc, "msg": msg, "type": kind}


def at_most(problems: list[dict[str, Any]], limit: int = MAX_PROBLEMS) -> list[dict[str, Any]]:
    """The first ``limit`` problems, then one that counts the rest: an answer stays small whatever the input
    (a command with 100,000 unknown fields is not answered with 100,000 entries)."""
    if len(problems) <= limit:
        return problems
    return [*problems[:limit], problem([], f"and {len(problems) - limit} more problems, not listed",
                                       "too_many_problems")]


def text_problem(text: str, max_length: int) -> str | None:
    """What makes ``text`` unstorable or too long (a phrase: "is longer than ..."), or None."""
    if len(text) > max_length:
        return f"is longer than {max_length} characters ({len(text)})"
    if (nul := text.find("\x00")) >= 0:
        return f"contains NUL (U+0000) at position {nul}, which PostgreSQL cannot store"
    if (surrogate := _SURROGATE.search(text)) is not None:
        return (f"contains a lone surrogate U+{ord(surrogate.group()):04X} at position {surrogate.start()}: "
                "not valid Unicode (invalid UTF-8 in the input?)")
    return None


class _BigInt(str):
    """An integer literal too long for 64 bits, kept as text by ``read_json`` for the walk to report."""


class _NonNumber(str):
    """``NaN``, ``Infinity`` or ``-Infinity``, which Python's JSON reader accepts and JSON does not."""


class _Object(dict):  # type: ignore[type-arg]
    """A JSON object that named some keys twice (the last value was kept)."""

    duplicates: tuple[str, ...] = ()


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) == len(pairs):
        return data
    obj = _Object(pairs)
    obj.duplicates = tuple(sorted(key for key, count in Counter(k for k, _ in pairs).items() if count > 1))
    return obj


def _integer(literal: str) -> int | _BigInt:
    return _BigInt(literal) if len(literal) > 20 else int(literal)


_EXACT_INTEGERS = 2**53  # floats below this hold every integer exactly


def _number(literal: str) -> float | int:
    """A JSON number with a point or an exponent: an integer when its value is one (``14.0``, ``1e3``), as JSON
    Schema counts it, if a float holds it exactly; a float otherwise (refused where a decimal is expected). The
    literal decides, not the float it rounds to: ``0.99999999999999999`` and ``1e-400`` are floats, not 1 and 0."""
    value = float(literal)
    if value.is_integer() and abs(value) < _EXACT_INTEGERS and _exactly(literal, int(value)):
        return int(value)
    return value


def _exactly(literal: str, whole: int) -> bool:
    try:
        return Decimal(literal) == whole
    except InvalidOperation:  # an exponent beyond what a Decimal holds: far from any whole number a float holds
        return False


def read_json(text: str | bytes | bytearray, limits: CommandLimits = DEFAULT_LIMITS,
              known: Callable[[str], bool] | None = None) -> Any:
    """Parse JSON text within ``limits`` and check the value (``check_json``); raise InvalidCommand, naming the
    command's ``type`` when the text parsed to an object whose type ``known`` accepts.

    Bytes must be UTF-8: invalid sequences become lone surrogates (surrogateescape), reported at the
    string that holds them. Duplicate keys, ``NaN`` and ``Infinity`` are refused. A number whose value is
    a whole number is an integer (``14.0`` is 14), as JSON Schema says.
    """
    size = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) and len(text) <= limits.max_bytes \
        else len(text)
    if size > limits.max_bytes:
        raise InvalidCommand(None, [too_large([], limits)])
    source = text if isinstance(text, str) else bytes(text).decode("utf-8", "surrogateescape")
    try:
        data = json.loads(source, object_pairs_hook=_object, parse_int=_integer, parse_float=_number,
                          parse_constant=_NonNumber)
    except json.JSONDecodeError as e:
        raise InvalidCommand(None, [problem([], f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                                            "json_invalid")]) from None
    except RecursionError:
        raise InvalidCommand(None, [problem([], f"nested deeper than {limits.max_depth} levels", "too_deep")]) from None
    kind = data.get("type") if isinstance(data, dict) else None
    check_json(data, limits, command_type=kind if isinstance(kind, str) and known is not None and known(kind) else None)
    return data


def check_json(value: Any, limits: CommandLimits = DEFAULT_LIMITS, *, command_type: str | None = None,
               objects: Mapping[str, tuple[type, ...]] | None = None) -> None:
    """Raise InvalidCommand (for ``command_type``) listing every problem of ``value`` with its location.

    ``objects`` names the top-level fields that may also hold objects of the given types (UUID, Decimal).
    """
    if _plainly_valid(value, limits, objects):
        return
    problems = _Walk(limits, objects or {}).problems(value)
    if problems:
        raise InvalidCommand(command_type, problems)


def too_large(loc: list[str | int], limits: CommandLimits) -> dict[str, Any]:
    return problem(loc, f"the command is larger than {limits.max_bytes} bytes of JSON", "too_large")


def _plainly_valid(value: Any, limits: CommandLimits, objects: Mapping[str, tuple[type, ...]] | None) -> bool:
    """The common command shape checked without the walk: a flat dict of usable string keys and scalar
    values (and the UUID/Decimal objects ``objects`` allows). False means "not sure": the walk decides
    and reports, so this never changes an error, only skips the walk where it would find nothing."""
    if type(value) is not dict:  # noqa: E721 - exactly dict: an _Object carries duplicate keys
        return False
    max_length = limits.max_string_length
    size = 2
    for key, item in value.items():
        if type(key) is not str or len(key) > max_length or _UNSTORABLE.search(key) is not None:  # noqa: E721
            return False
        size += len(key) + 4
        kind = type(item)
        if kind is str:
            if len(item) > max_length or _UNSTORABLE.search(item) is not None:
                return False
            size += len(item) + 1
        elif kind is int:
            if not INT_MIN <= item <= INT_MAX:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is bool or item is None:
            pass
        elif objects is not None and isinstance(item, objects.get(key, ())) and not isinstance(item, _SCALARS):
            size += len(str(item))
        else:
            return False
    return size <= limits.max_bytes


_ROOT = object()  # the name of the value a walk starts from


class _Walk:
    """A depth-first walk with an explicit stack of iterators; ``size`` is a lower bound of the JSON bytes."""

    def __init__(self, limits: CommandLimits, objects: Mapping[str, tuple[type, ...]]):
        self.limits = limits
        self.objects = objects
        self.found: list[dict[str, Any]] = []
        self.size = 0

    def problems(self, value: Any) -> list[dict[str, Any]]:
        stack: list[tuple[Iterator[tuple[Any, Any, bool]], list[str | int], int]] = [
            (iter([(_ROOT, value, False)]), [], 1)]
        while stack and len(self.found) < MAX_PROBLEMS:
            entries, prefix, depth = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                continue
            name, item, is_key = entry
            loc = prefix if name is _ROOT else [*prefix, self._label(name, prefix) if is_key else name]
            children = self._visit(item, loc, depth)
            if self.size > self.limits.max_bytes:
                self.found.append(too_large(loc, self.limits))
                break
            if children is not None:
                stack.append((children, loc, depth + 1))
        return self.found

    def _label(self, key: Any, prefix: list[str | int]) -> str:
        """A key as a location: itself when it is usable text, else a printable form (and a problem)."""
        if not isinstance(key, str):
            label = printable(key)
            self.found.append(problem([*prefix, label], f"object keys must be strings, not {type(key).__name__}",
                                      "key_type"))
            return label
        self.size += len(key) + 3
        wrong = text_problem(key, self.limits.max_string_length)
        if wrong is None:
            return key
        label = printable(key, 40)
        self.found.append(problem([*prefix, label], f"the key {wrong}", "key_invalid"))
        return label

    def _visit(self, item: Any, loc: list[str | int], depth: int) -> Iterator[tuple[Any, Any, bool]] | None:
        """Check one value; return an iterator over its children to walk, if it has any."""
        self.size += 1
        wrong: tuple[str, str] | None = None
        if isinstance(item, _NonNumber):
            wrong = (f"{item} is not JSON: use a number", "json_number")
        elif isinstance(item, _BigInt):
            wrong = _OUT_OF_RANGE
        elif isinstance(item, str):
            self.size += len(item) + 1
            text = text_problem(item, self.limits.max_string_length)
            wrong = None if text is None else (text, "string_invalid")
        elif item is None or isinstance(item, bool):
            pass
        elif isinstance(item, int):
            wrong = None if INT_MIN <= item <= INT_MAX else _OUT_OF_RANGE
        elif isinstance(item, float):
            wrong = None if math.isfinite(item) else (f"{item} is not a finite number", "float_not_finite")
        elif isinstance(item, (dict, list, tuple)):
            return self._container(item, loc, depth)
        elif len(loc) == 1 and isinstance(item, self.objects.get(str(loc[0]), ())):
            self.size += len(str(item))
        else:
            wrong = (f"{type(item).__name__} is not a JSON value{self._where_objects_go(item)}", "json_type")
        if wrong is not None:
            self.found.append(problem(loc, *wrong))
        return None

    def _container(self, item: dict[Any, Any] | list[Any] | tuple[Any, ...], loc: list[str | int],
                   depth: int) -> Iterator[tuple[Any, Any, bool]] | None:
        if depth > self.limits.max_depth:
            self.found.append(problem(loc, f"nested deeper than {self.limits.max_depth} levels", "too_deep"))
            return None
        self.size += 1
        if isinstance(item, dict):
            self.found.extend(problem([*loc, printable(key)], "key given more than once", "duplicate_key")
                              for key in getattr(item, "duplicates", ()))
            return ((key, value, True) for key, value in item.items())
        if len(item) > self.limits.max_list_length:
            self.found.append(problem(loc, f"more than {self.limits.max_list_length} items ({len(item)})",
                                      "list_too_long"))
            return None
        return ((index, value, False) for index, value in enumerate(item))

    def _where_objects_go(self, item: Any) -> str:
        fields = sorted(name for name, types in self.objects.items() if isinstance(item, types))
        return f" (a {type(item).__name__} object is accepted in {', '.join(fields)} only)" if fields else ""


def check_idempotency_key(key: Any, command_type: str) -> str:
    """The key as it is stored and compared: surrounding spaces and tabs dropped, then 1-255 printable ASCII
    characters (`` `` to ``~``). HTTP never counts white space around a header value as part of it, so every
    entry point (Python, the CLI, HTTP) drops it alike; and an IETF Idempotency-Key is a structured-field
    string, printable ASCII only, so no entry point can read the same key as different bytes."""
    if key is None:
        raise MissingIdempotencyKey(command_type)
    if not isinstance(key, str):
        reason = f"the idempotency key must be a string, not {type(key).__name__}"
    elif not (key := key.strip(KEY_WHITE_SPACE)):
        reason = "the idempotency key must not be empty or only spaces"
    elif len(key) > MAX_KEY_LENGTH:
        reason = f"the idempotency key is longer than {MAX_KEY_LENGTH} characters ({len(key)})"
    elif (found := _NOT_KEY.search(key)) is not None:
        char, position = found.group(), found.start()
        if char.isprintable():
            reason = (f"the idempotency key must be printable ASCII (an IETF Idempotency-Key is a structured-field "
                      f"string): {char!r} (U+{ord(char):04X}) at position {position} is not")
        else:
            reason = f"the idempotency key contains the unprintable character U+{ord(char):04X} at position {position}"
    else:
        return key
    raise InvalidIdempotencyKey(command_type, reason)


def idempotency_key_or_none(key: Any) -> str | None:
    """The key as ``check_idempotency_key`` would store it, or None for one it would refuse."""
    try:
        return check_idempotency_key(key, "")
    except MissingIdempotencyKey:  # InvalidIdempotencyKey included
        return None


def check_tenant(tenant: Any) -> str:
    """The tenant, if valid: 1-64 characters of letters, digits, '.', '_' or '-'."""
    if not isinstance(tenant, str) or _TENANT.fullmatch(tenant) is None:
        raise InvalidTenant(tenant)
    return tenant
