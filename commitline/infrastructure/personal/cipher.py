"""``PersonalData``: sealing one personal value under its subject's data key, and opening it again.

A sealed value is stored in place of the plain one as ``{"ciphertext": <base64 of nonce, ciphertext and tag>,
"key_id": <the data key's id>}``; the key id is the only reference to the subject the value carries. A value
whose data key is gone (its subject was erased) opens as ``ERASED``.

Data keys are kept unwrapped in this process for ``ttl_s`` seconds (and erased ids for good: a key id never
comes back), so most seals and opens cost no read. Another process's erasure reaches this one by a notification
(``watch``, an ``ErasureWatch`` listening before the first key is read): ``forget`` drops the key at once, and a key
read from the table just before the erasure is not kept after it. Only when the notifications' connection is
lost does ``ttl_s`` bound how long an erased key may still be used (``forget_all`` drops every key when it is
lost and again when it is back). The master key is asked for only when a data key is to be wrapped or
unwrapped: a missing one fails there with ``ConfigurationError``, a wrong one with ``WrongMasterKey``, before
anything is written.

A key a command makes for a new subject is not written on its own: it is one of the command's ``NewKeys``,
inserted by the command's append in the same transaction as its events (so a command refused or failed leaves
no key), and held by the process only once that append committed (``stored``). Should the subject have got a
key first (another command's, another process's), the append is refused and its events sealed again, under the
key the subject has.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any
from uuid import UUID, uuid4

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from commitline.application.errors import WrongMasterKey
from commitline.domain.personal import ERASED, ERASED_JSON, Erased
from commitline.infrastructure.personal.keys import DataKeys, KeyRow
from commitline.infrastructure.personal.master import KEY_BYTES, NONCE_BYTES, MasterKey, MasterKeys

CIPHERTEXT, KEY_ID = "ciphertext", "key_id"


class SealBroken(ValueError):
    """A sealed value does not open under its own data key: it was altered, or moved from another event, field,
    subject or tenant (``commitline audit verify`` finds which stored bytes changed)."""


def sealing_context(tenant: str, subject: str, event_id: str, field: str) -> bytes:
    """The associated data of one sealed value."""
    return "\x00".join(("commitline/personal/v1", tenant, subject, event_id, field)).encode("utf-8", "surrogatepass")


class _Key:
    __slots__ = ("key_id", "tenant", "subject", "aead", "expires")

    def __init__(self, row: KeyRow, aead: AESGCM | None, expires: float):
        self.key_id, self.tenant, self.subject, self.aead, self.expires = row.key_id, row.tenant, row.subject, aead, \
            expires


class NewKeys:
    """The data keys one command's values are sealed under that are not stored yet, each made here for a subject
    that had none: the command's append inserts their ``rows`` in its transaction. ``guess``: a subject that is
    the id of the stream an event starts is taken for a new one without reading the key table (a wrong guess
    costs one refused append; the command's events are then sealed again with ``guess`` off, every subject read)."""

    __slots__ = ("keys", "guess")

    def __init__(self, guess: bool = True):
        self.keys: dict[tuple[str, str], tuple[_Key, KeyRow, int]] = {}  # with the ``forget_all`` count it saw
        self.guess = guess

    @property
    def rows(self) -> list[KeyRow]:
        return [row for _, row, _ in self.keys.values()]


class PersonalData:
    """Seals and opens personal values of one schema; ``master`` gives the master key (or raises), ``previous``
    is the one before it during a rolling rotation."""

    def __init__(self, keys: DataKeys, master: Callable[[], MasterKey], *, previous: MasterKey | None = None,
                 ttl_s: float = 30.0, size: int = 100_000):
        self.keys = keys
        self._master_source = master
        self._previous = previous
        self._master: MasterKeys | None = None
        self.ttl_s = ttl_s
        self.size = size
        self._by_subject: OrderedDict[tuple[str, str], _Key] = OrderedDict()
        self._by_id: OrderedDict[UUID, _Key] = OrderedDict()
        self._lock = threading.Lock()
        self._generation = 0  # counts ``forget_all``: a key read before one is used, not kept
        #: started before the first key is read (``ErasureWatch``: ``start()``, ``close()``); None: not watched
        self.watch: Any = None

    def master(self) -> MasterKeys:
        """The master key (and the previous one, if configured), once checked against the key table and the
        record of master keys in use (``DataKeys.claim_master``): refused (WrongMasterKey) when the table holds
        keys and none is wrapped under either, or holds none and the store recorded another master key in use,
        so a process with a wrong key never adds keys of its own. Mid-rotation both the old and the new key
        pass."""
        if self._master is None:
            master = MasterKeys(self._master_source(), self._previous)
            refused = self.keys.claim_master(master.key_ids)
            if refused is not None:
                which = " or ".join(master.key_ids)
                origin = master.current.origin
                if origin is not None:  # made in this data folder: the store's key is in the one it came from
                    raise WrongMasterKey(variable="COMMITLINE_DATA_DIR", reason=(
                        f"the development master key {which} (the data folder's master-key file: COMMITLINE_MASTER_KEY "
                        f"is unset) is not the store's: {refused}; copy the master-key file of the data folder the "
                        "store comes from over it, or set COMMITLINE_MASTER_KEY; nothing was written"))
                raise WrongMasterKey(reason=f"the configured master key {which} is not the store's: {refused}; nothing "
                                     "was written")
            self._master = master
        return self._master

    def master_still_passes(self) -> None:
        """``master``, and then its check again against the store as it is now (a read): WrongMasterKey once a
        rotation elsewhere retired this process's key, which then opens and wraps no key the store holds."""
        master = self.master()
        refused = self.keys.check_master(master.key_ids)
        if refused is not None:
            raise WrongMasterKey(reason=f"the configured master key {' or '.join(master.key_ids)} is not the store's "
                                 f"any more: {refused}; nothing was written")

    # -- sealing ---------------------------------------------------------------------------

    def seal(self, tenant: str, subject: str, event_id: str, field: str, value: Any, plain: bytes,
             new: NewKeys | None = None, fresh: bool = False) -> Any:
        """The stored form of ``value`` (whose JSON is ``plain``), a field of the event ``event_id``. With ``new``,
        a subject without a key gets one there, to be inserted with the events (``fresh``: the subject is the id
        of the stream the event starts); without it, the subject's new key is inserted here, committed at once."""
        if isinstance(value, Erased):
            return dict(ERASED_JSON)  # nothing left to seal
        key = self._key_for(tenant, subject, new, fresh)
        nonce = os.urandom(NONCE_BYTES)
        aead: AESGCM = key.aead  # type: ignore[assignment]  # a key in use always has one
        sealed = aead.encrypt(nonce, plain, sealing_context(tenant, subject, event_id, field))
        return {CIPHERTEXT: base64.b64encode(nonce + sealed).decode(), KEY_ID: str(key.key_id)}

    def open(self, tenant: str, event_id: str, field: str, stored: Any) -> Any:
        """The JSON value sealed in ``stored``, or ERASED once its subject was erased."""
        if not isinstance(stored, dict) or KEY_ID not in stored:
            return ERASED
        key = self._key_by_id(UUID(stored[KEY_ID]))
        if key is None:
            return ERASED
        raw = base64.b64decode(stored[CIPHERTEXT])
        try:
            plain = key.aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:],  # type: ignore[union-attr]
                                     sealing_context(tenant, key.subject, event_id, field))
        except InvalidTag:
            raise SealBroken(f"the personal field {field} of event {event_id} does not open under its data key "
                             f"{key.key_id}: it was altered or moved") from None
        return orjson.loads(plain)

    def forget(self, key_ids: Iterable[UUID]) -> None:
        """Erased keys: never used again by this process."""
        with self._lock:
            for key_id in key_ids:
                held = self._by_id.get(key_id)
                if held is not None:
                    self._by_subject.pop((held.tenant, held.subject), None)
                self._by_id[key_id] = _Key(KeyRow(key_id, "", ""), None, float("inf"))

    def forget_all(self) -> None:
        """Drop every key held (erasures may have been missed): each is read again when next used. Erased ids
        stay erased."""
        with self._lock:
            self._generation += 1
            self._by_subject.clear()
            for key_id in [k for k, held in self._by_id.items() if held.aead is not None]:
                del self._by_id[key_id]

    def held(self) -> int:
        """How many data keys this process holds unwrapped now."""
        with self._lock:
            return sum(1 for held in self._by_id.values() if held.aead is not None)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()

    # -- the keys ----------------------------------------------------------------------------

    def stored(self, new: NewKeys) -> None:
        """``new``'s keys, once the append that inserted them committed: held as any key read from the table."""
        for key, _, generation in new.keys.values():
            self._keep(key, generation)

    def _key_for(self, tenant: str, subject: str, new: NewKeys | None = None, fresh: bool = False) -> _Key:
        if new is not None and (made := new.keys.get((tenant, subject))) is not None:
            return made[0]
        now = time.monotonic()
        with self._lock:
            held = self._by_subject.get((tenant, subject))
            generation = self._generation
        if held is not None and held.expires > now:
            return held
        self._watching()
        master = self.master()  # before any write: a missing master key writes nothing
        if new is not None:
            return self._new_or_stored(tenant, subject, new, fresh and new.guess, master, now, generation)
        while True:  # once, but for an erasure of this very subject while its key was read
            key_id, data_key = uuid4(), AESGCM.generate_key(bit_length=KEY_BYTES * 8)
            row = self.keys.find_or_add(KeyRow(key_id, tenant, subject, master.wrap(data_key, str(key_id), tenant,
                                                                                       subject), master.key_id))
            if row.key_id != key_id:  # the subject has its key already
                data_key = master.unwrap(row.wrapped, row.master_key_id, str(row.key_id), tenant, subject)
            kept = self._keep(_Key(row, AESGCM(data_key), now + self.ttl_s), generation)
            if kept.aead is not None:
                return kept
            # erased while it was read (its notification came in between): the subject gets a new key

    def _new_or_stored(self, tenant: str, subject: str, new: NewKeys, guess: bool, master: MasterKeys,
                       now: float, generation: int) -> _Key:
        """The subject's stored key (read, unless ``guess`` says it has none), else a new one in ``new``."""
        if not guess and (row := self.keys.find(tenant, subject)) is not None:
            kept = self._unwrapped(row, now, generation)
            if kept.aead is not None:
                return kept
            # erased while it was read: the subject gets a new key
        key_id, data_key = uuid4(), AESGCM.generate_key(bit_length=KEY_BYTES * 8)
        row = KeyRow(key_id, tenant, subject, master.wrap(data_key, str(key_id), tenant, subject), master.key_id)
        key = _Key(row, AESGCM(data_key), now + self.ttl_s)
        new.keys[(tenant, subject)] = (key, row, generation)
        return key

    def preload(self, key_ids: Iterable[UUID]) -> None:
        """Hold the keys of ``key_ids`` not held yet, read in one statement: a batch of events (a projection's,
        a rebuild's) then opens its values without a read per subject. Ids without a row are left to ``open``."""
        now = time.monotonic()
        with self._lock:
            missing = [k for k in set(key_ids) if (held := self._by_id.get(k)) is None
                       or (held.aead is not None and held.expires <= now)]
            generation = self._generation
        if missing:
            self._watching()
            for row in self.keys.get_many(missing):
                self._unwrapped(row, now, generation)

    def _key_by_id(self, key_id: UUID) -> _Key | None:
        now = time.monotonic()
        with self._lock:
            held = self._by_id.get(key_id)
            generation = self._generation
        if held is not None and (held.aead is None or held.expires > now):
            return held if held.aead is not None else None
        self._watching()
        row = self.keys.get(key_id)
        if row is None:
            self.forget([key_id])
            return None
        key = self._unwrapped(row, now, generation)
        return key if key.aead is not None else None

    def _watching(self) -> None:
        """Before a key is first read from the table: other processes' erasures are listened for from then on."""
        if self.watch is not None:
            self.watch.start()

    def _unwrapped(self, row: KeyRow, now: float, generation: int) -> _Key:
        data_key = self.master().unwrap(row.wrapped, row.master_key_id, str(row.key_id), row.tenant, row.subject)
        return self._keep(_Key(row, AESGCM(data_key), now + self.ttl_s), generation)

    def _keep(self, key: _Key, generation: int) -> _Key:
        """Hold ``key``, read when ``forget_all`` had run ``generation`` times. Not when it was erased meanwhile
        (its notification came while it was read: the erased marker is returned), nor when every key was dropped
        meanwhile (then it serves this one use only)."""
        with self._lock:
            held = self._by_id.get(key.key_id)
            if held is not None and held.aead is None:
                return held
            if generation != self._generation:
                return key
            self._by_subject[(key.tenant, key.subject)] = key
            self._by_id[key.key_id] = key
            for cache in (self._by_subject, self._by_id):
                while len(cache) > self.size:
                    cache.popitem(last=False)
        return key
