"""``PersonalRecords``: a Kafka consumer's way to open the personal fields of the records commitline publishes.

A record's value is an envelope (``infrastructure/kafka/envelope.py``) whose personal fields are sealed as the
store holds them, ``{"ciphertext": ..., "key_id": ...}``, and named under ``personal``. A consumer trusted with
them (one given the database and the master key) opens them with the same data keys, wrapped under the same
master key, that the store uses: ``open`` returns the envelope with each personal value in plain JSON, or
``ERASED`` once its subject was erased. An envelope without personal fields comes back as it was.

It reads only the ``data_keys`` table, with connections of its own (two at most, and one listening for
erasures), and writes nothing. As every commitline process does, it holds data keys unwrapped for ``ttl_s``
seconds (``COMMITLINE_DATA_KEY_TTL_S``) and listens for erasures (``ErasureWatch``), so an erasure made anywhere
reaches an open consumer within moments; an erased key is never used again by this object. During a rolling
rotation, ``COMMITLINE_PREVIOUS_MASTER_KEY`` opens keys still wrapped under the old master key.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from commitline.composition.wiring import connection_parts, master_key_source
from commitline.domain.errors import InvalidValue
from commitline.infrastructure.config import load_settings
from commitline.infrastructure.personal.cipher import PersonalData
from commitline.infrastructure.personal.erasure_watch import ErasureWatch
from commitline.infrastructure.personal.keys import DataKeys
from commitline.infrastructure.personal.master import MasterKey
from commitline.infrastructure.store.datastore import StoreDatastore

_NEEDED = ("event_id", "tenant", "payload")
DEFAULT_SCHEMA = "commitline"  # the built-in examples' (a team's domain: its name, or COMMITLINE_SCHEMA)


class PersonalRecords:
    """Opens the personal fields of commitline's Kafka records; close it (or use ``with``) to release its
    connections. Unset arguments come from ``COMMITLINE_DATABASE_URL``, ``COMMITLINE_MASTER_KEY`` and
    ``COMMITLINE_SCHEMA`` (the schema of the store that published the records; default ``commitline``); with no
    database URL at all, from the data folder's embedded PostgreSQL and development key, as any commitline
    process."""

    def __init__(self, database_url: str | None = None, *, master_key: str | None = None, schema: str | None = None,
                 ttl_s: float | None = None):
        given = {k: v for k, v in (("COMMITLINE_DATABASE_URL", database_url), ("COMMITLINE_MASTER_KEY", master_key),
                                   ("COMMITLINE_SCHEMA", schema)) if v is not None}
        settings = load_settings({**os.environ, **given})  # checked as the variables are (a bad key: named, unshown)
        self.schema = settings.schema_name or DEFAULT_SCHEMA
        parts, self._shared = connection_parts(settings)  # no URL: the data folder's embedded PostgreSQL
        self._datastore = StoreDatastore(parts["dbname"], parts["host"], parts["port"], parts["user"],
                                         parts["password"], pool_size=1, max_overflow=1, schema=self.schema,
                                         pool_timeout=settings.pool_timeout_s, libpq=parts)
        keys = DataKeys(self._datastore.get_connection, self.schema)
        previous = settings.previous_master_key
        self.personal = PersonalData(keys, master_key_source(settings), ttl_s=ttl_s or settings.data_key_ttl_s,
                                     previous=MasterKey.parse(previous.get_secret_value()) if previous else None)
        self.personal.watch = ErasureWatch(parts, keys.channel, self.personal.forget, self.personal.forget_all,
                                           lambda: self._datastore.connections_lost)

    def open(self, value: bytes | str | dict[str, Any]) -> dict[str, Any]:
        """The envelope ``value`` (a record's value, or its parsed JSON) with each personal field opened: its plain
        JSON value, or ``ERASED``. InvalidValue when ``value`` is not a commitline envelope; ConfigurationError
        or WrongMasterKey when the master key is missing or is not the one that wrapped the data keys."""
        envelope = _parsed(value)
        fields = envelope.get("personal")
        missing = [name for name in _NEEDED if name not in envelope]
        if missing or not isinstance(fields or [], list) or not isinstance(envelope["payload"], dict):
            raise InvalidValue("record", f"{len(orjson.dumps(envelope))} bytes", "is not a commitline envelope "
                               f"(missing: {', '.join(missing) or 'none'}; its payload an object, its personal "
                               "fields a list)")
        if not fields:
            return envelope
        payload = dict(envelope["payload"])
        for name in fields:
            if name in payload:
                payload[name] = self.personal.open(envelope["tenant"], envelope["event_id"], name, payload[name])
        return {**envelope, "payload": payload}

    def close(self) -> None:
        self.personal.close()
        self._datastore.close()
        if self._shared is not None:  # stopped only if no other process uses it
            self._shared.release()

    def __enter__(self) -> PersonalRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PersonalRecords(schema={self.schema!r})"  # never the URL's password nor the master key


def _parsed(value: bytes | str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if not isinstance(value, (bytes, bytearray, memoryview, str)):
        raise InvalidValue("record", type(value).__name__, "must be a record's value: bytes, str or its parsed dict")
    try:
        envelope = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise InvalidValue("record", f"{len(value)} bytes", "is not JSON: give the record's value as commitline "
                           "published it") from None
    if not isinstance(envelope, dict):
        raise InvalidValue("record", type(envelope).__name__, "is not a commitline envelope (a JSON object)")
    return envelope
