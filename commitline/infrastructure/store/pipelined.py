"""The command hot path's wire: named prepared statements sent over libpq's pipeline, one round trip.

psycopg's cursor does per call what the hot path needs once: composing the SQL, converting the query,
adapting every parameter, and its pipeline waits for replies at every sync. Here a statement is
prepared once per connection (by name), its parameters go as bytes (text format; bytea, uuid and
arrays in binary), and a whole sequence of statements, syncs included, is sent before any reply is
read. After an error the server skips everything up to the next sync; ``recorder.EventRecorder.
append_batch`` therefore sends statements that never fail (each command's append function catches its
own error), so a batch needs one sync. The sync's socket write runs without the GIL where libpq allows
(``_released_gil_sync``).

Sending and receiving overlap (psycopg's ``send`` reads replies while it flushes), so a large
sequence never deadlocks on full socket buffers.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import struct
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.generators import fetch, send
from psycopg.sql import Composable

OIDS = {"uuid": 2950, "int8": 20, "int4": 23, "text": 25, "bytea": 17, "bool": 16,
        "uuid[]": 2951, "int8[]": 1016, "text[]": 1009, "bytea[]": 1001}
#: Parameter types sent in binary: bytea as it is, arrays in PostgreSQL's binary array format.
_BINARY = frozenset(("bytea", "uuid", "uuid[]", "int8[]", "text[]", "bytea[]"))
_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
FATAL = pq.ExecStatus.FATAL_ERROR
_SYNC = pq.ExecStatus.PIPELINE_SYNC
SQLSTATE = pq.DiagnosticField.SQLSTATE


@dataclass(frozen=True)
class Statement:
    """A statement prepared by ``name`` on each connection that runs it; ``types`` name its
    parameters' PostgreSQL types (``OIDS``), bytea, uuid and arrays are sent in binary (an array's value is a
    list of its elements; none of them may be None)."""

    name: bytes
    sql: bytes
    types: tuple[str, ...]

    @classmethod
    def of(cls, query: Composable, types: Sequence[str]) -> Statement:
        """Named after its text: recorders of other schemas or tables sharing a connection never clash."""
        sql = query.as_bytes(None)
        return cls(b"cl_" + hashlib.sha1(sql).hexdigest()[:20].encode(), sql, tuple(types))

    def params(self, values: Sequence[Any]) -> list[bytes | None]:
        return [None if v is None else dump(v) for dump, v in zip(self._dumps, values)]

    @functools.cached_property
    def formats(self) -> list[int]:
        return [1 if t in _BINARY else 0 for t in self.types]

    @functools.cached_property
    def _dumps(self) -> list[Callable[[Any], bytes]]:
        return [_DUMPS[t] for t in self.types]


def _bytes(value: Any) -> bytes:
    return value


def _str(value: Any) -> bytes:
    return str(value).encode()


def _array(element_oid: int, dump: Callable[[Any], bytes]) -> Callable[[Sequence[Any]], bytes]:
    """PostgreSQL's binary array format, one dimension, no NULLs: a header, then each element's length
    and bytes."""
    def dumped(values: Sequence[Any]) -> bytes:
        parts = [_ARRAY_HEADER.pack(1, 0, element_oid, len(values), 1)]
        for v in values:
            b = dump(v)
            parts.append(_LENGTH.pack(len(b)))
            parts.append(b)
        return b"".join(parts)
    return dumped


_ARRAY_HEADER = struct.Struct("!iiIii")  # dimensions, has-nulls flag, element type; per dimension: size, lower bound
_LENGTH = struct.Struct("!i")
_INT8 = struct.Struct("!q")

_DUMPS: dict[str, Callable[[Any], bytes]] = {
    "bytea": _bytes, "text": str.encode, "uuid": lambda v: v.bytes, "int8": _str, "int4": _str,
    "bool": lambda v: b"t" if v else b"f",
    "uuid[]": _array(OIDS["uuid"], lambda v: v.bytes), "int8[]": _array(OIDS["int8"], _INT8.pack),
    "text[]": _array(OIDS["text"], str.encode), "bytea[]": _array(OIDS["bytea"], _bytes),
}


#: One step of a pipeline: a prepared statement with its values, a plain command (BEGIN, COMMIT ...),
#: a sync, or a hook run once every reply before it has arrived (then the rest is sent).
Step = tuple[Statement, Sequence[Any]] | bytes | Callable[[], None] | None
SYNC: None = None


# The statements prepared on each connection (a pooled connection is used by one thread at a time).
_prepared: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()
_prepared_lock = threading.Lock()


def run(conn: Any, steps: Sequence[Step]) -> list[pq.abc.PGresult | None]:
    """Send ``steps`` (ending with a sync), return one result per step (None for syncs and hooks;
    a FATAL_ERROR or PIPELINE_ABORTED result where the server failed or skipped it).

    Any failure to talk to the server closes the connection (the pool then replaces it): it may hold
    unread replies or an open transaction."""
    pgconn = conn.pgconn
    with _prepared_lock:
        prepared = _prepared.setdefault(conn, set())
    _psycopg_deallocates_first(conn, prepared)
    results: list[pq.abc.PGresult | None] = []
    newly: dict[bytes, Statement] = {}
    for step in steps:
        if type(step) is tuple and step[0].name not in prepared:
            newly[step[0].name] = step[0]
    try:
        pgconn.enter_pipeline_mode()
        # Prepares first, each followed by a sync: one queued after an error would be skipped, not made, and
        # one the server already has (our bookkeeping lost track of it) fails alone, harmlessly.
        sent: list[int] = []  # per step sent since the last read: -1 prepare, 0 sync, 1 statement
        for name, statement in newly.items():
            pgconn.send_prepare(name, statement.sql, [OIDS[t] for t in statement.types])
            pgconn.pipeline_sync()
            sent += [-1, 0]
        for step in steps:
            kind = type(step)
            if kind is tuple:
                statement, values = step  # type: ignore[misc]
                pgconn.send_query_prepared(statement.name, statement.params(values), statement.formats,
                                           result_format=1)
                sent.append(1)
            elif kind is bytes:
                pgconn.send_query_params(step, None, result_format=1)
                sent.append(1)
            elif step is None:
                _pipeline_sync(pgconn)
                sent.append(0)
            else:  # a hook
                pgconn.send_flush_request()  # else the server keeps the replies after the last sync
                results.extend(_receive(conn, sent))
                sent = []
                step()  # type: ignore[operator]
                results.append(None)
        results.extend(_receive(conn, sent))
        pgconn.exit_pipeline_mode()
        prepared.update(newly)
    except BaseException:
        conn.close()
        raise
    return results


def _released_gil_sync() -> Callable[[Any], None] | None:
    """A pipeline sync whose socket write runs without the interpreter lock, or None where it cannot be had.

    psycopg's ``pipeline_sync`` (libpq's ``PQpipelineSync``) writes to the socket while holding the GIL;
    on loopback that write also runs the server's receive path and wakes its backend, tens of microseconds
    in which no other thread of the process runs Python. Through ctypes (which releases the GIL around a
    foreign call), on the very libpq psycopg uses (the one bundled with psycopg[binary]), libpq 17's
    ``PQsendPipelineSync`` queues the sync without writing and ``PQflush`` writes without the lock. What
    the non-blocking socket did not take is written by psycopg's own ``send`` before any reply is read."""
    try:
        if pq.__impl__ != "binary" or pq.version() < 170000:
            return None
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/psycopg_binary.libs/libpq" in line}
        if len(paths) != 1:
            return None
        libpq = ctypes.CDLL(paths.pop())
        queue_sync, flush = libpq.PQsendPipelineSync, libpq.PQflush
    except (OSError, AttributeError):
        return None
    queue_sync.argtypes = flush.argtypes = [ctypes.c_void_p]
    queue_sync.restype = flush.restype = ctypes.c_int

    def sync(pgconn: Any) -> None:
        pointer = pgconn.pgconn_ptr
        if queue_sync(pointer) != 1:
            raise pg_errors.OperationalError(f"sending a pipeline sync failed: {pgconn.get_error_message()}")
        if flush(pointer) < 0:
            raise pg_errors.OperationalError(f"sending to the server failed: {pgconn.get_error_message()}")
    return sync


def plain_sync(pgconn: Any) -> None:
    pgconn.pipeline_sync()


_pipeline_sync = _released_gil_sync() or plain_sync


def _psycopg_deallocates_first(conn: Any, prepared: set[bytes]) -> None:
    """psycopg sends ``DEALLOCATE ALL`` before its next statement on a connection where it saw a ROLLBACK
    (and had prepared statements of its own): then ours would go too. If one is pending, let it run now,
    and prepare ours after it. (psycopg's private state, read defensively: should it change, the
    ``statements_lost`` retry still recovers, only more often.)"""
    manager = getattr(conn, "_prepared", None)
    pending = getattr(manager, "_to_flush", None)
    if pending and None in pending:
        conn.wait(manager.maintain_gen(conn))  # type: ignore[union-attr]
        prepared.clear()


def _receive(conn: Any, sent: list[int]) -> list[pq.abc.PGresult | None]:
    """The replies to what was sent: the last result of each statement, None for each sync."""
    if not sent:
        return []
    pgconn = conn.pgconn
    conn.wait(send(pgconn))
    out: list[pq.abc.PGresult | None] = []
    prepares = 0
    for kind in sent:
        last = None
        while True:  # a statement's results end with None; a sync is one PIPELINE_SYNC result
            result = conn.wait(fetch(pgconn)) if pgconn.is_busy() else pgconn.get_result()
            if result is None:
                break
            last = result
            if result.status == _SYNC:
                break
        if kind == 1:
            out.append(last)
        elif kind == 0:
            if not prepares:
                out.append(None)
            prepares = max(0, prepares - 1)
        elif last is None or last.status == FATAL and last.error_field(SQLSTATE) != b"42P05":  # 42P05: it exists
            raise error_of(last, pgconn) if last is not None else pg_errors.ProtocolViolation("no reply")
        else:
            prepares += 1  # its sync is not a step either
    return out


def statements_lost(conn: Any, results: Sequence[pq.abc.PGresult | None]) -> bool:
    """Did the server no longer know a statement prepared on ``conn``? psycopg sends ``DEALLOCATE ALL``
    on a connection after it saw a ROLLBACK there, dropping ours too. Then they are forgotten (the next
    run prepares them again) and the caller runs its pipeline again: the first of them failed, so the
    server skipped everything up to the next sync, and ran nothing that used them."""
    lost = any(r is not None and r.status == FATAL and r.error_field(SQLSTATE) == b"26000"
               for r in results)
    if lost:
        with _prepared_lock:
            _prepared.pop(conn, None)
    return lost


def committed(result: pq.abc.PGresult | None) -> bool:
    """Did this COMMIT commit? (In a failed transaction COMMIT succeeds, as a ROLLBACK.)"""
    return ok(result) and (result.command_status or b"").startswith(b"COMMIT")  # type: ignore[union-attr]


def error_of(result: pq.abc.PGresult, pgconn: Any) -> pg_errors.Error:
    """The psycopg exception (with its diagnostics) a failed result stands for."""
    return pg_errors.error_from_result(result, encoding=pgconn._encoding)


def ok(result: pq.abc.PGresult | None) -> bool:
    return result is not None and result.status in _OK


# Binary result columns.
def int8(value: bytes) -> int:
    return int.from_bytes(value, "big", signed=True)


def int8_array(value: bytes | None) -> list[int]:
    """A one-dimensional int8[] without NULLs, in binary (None or empty: [])."""
    if value is None:
        return []
    value = bytes(value)
    dimensions = _LENGTH.unpack_from(value, 0)[0]
    if dimensions == 0:
        return []
    count = _LENGTH.unpack_from(value, 12)[0]
    return [_INT8.unpack_from(value, 24 + 12 * i)[0] for i in range(count)]  # each: length (4) + value (8)


def uuid(value: bytes) -> UUID:
    return UUID(bytes=bytes(value))


def text(value: bytes) -> str:
    return bytes(value).decode()
