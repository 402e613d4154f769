"""The master key: parsed from ``COMMITLINE_MASTER_KEY`` (base64 of 32 bytes), wrapping and unwrapping data keys;
during a rolling rotation, with the previous key (``COMMITLINE_PREVIOUS_MASTER_KEY``) beside it (``MasterKeys``).

Its id is derived from it (an HMAC of a fixed label, 16 hex digits), so an id cannot disagree with its key and
two keys never share one; each wrapped data key records the id of the master key that wrapped it. Neither the
key nor anything derived from it but the id appears in a ``repr``, a log line or an error message.

With the embedded PostgreSQL (no ``COMMITLINE_DATABASE_URL``) and no variable set, a development key is made
once and kept beside the embedded database in the data folder (``development_key``): the quickstart works
without configuration, and a configured database never falls back to it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from commitline.application.errors import WrongMasterKey

VARIABLE = "COMMITLINE_MASTER_KEY"
KEY_BYTES = 32
NONCE_BYTES = 12
DEVELOPMENT_KEY_FILE = "master-key"


def wrapping_context(key_id: str, tenant: str, subject: str) -> bytes:
    """The associated data of a wrapped data key: a wrapped key cannot be moved to another row."""
    return "\x00".join(("commitline/data-key/v1", key_id, tenant, subject)).encode("utf-8", "surrogatepass")


class MasterKey:
    """One master key; ``key_id`` is public, the key itself is never shown."""

    __slots__ = ("key_id", "_aead", "origin")

    def __init__(self, secret: bytes):
        self.origin: Path | None = None  # the development key's file; None: from COMMITLINE_MASTER_KEY
        if len(secret) != KEY_BYTES:
            raise ValueError(f"must be the base64 of {KEY_BYTES} random bytes (e.g. `openssl rand -base64 32`)")
        self.key_id = hmac.new(secret, b"commitline master key id", hashlib.sha256).hexdigest()[:16]
        self._aead = AESGCM(secret)

    @classmethod
    def parse(cls, text: str) -> MasterKey:
        """A key from its base64 text; ValueError (naming nothing of the text) when it is not one."""
        try:
            secret = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"must be the base64 of {KEY_BYTES} random bytes (e.g. `openssl rand -base64 32`)") \
                from None
        return cls(secret)

    def __repr__(self) -> str:
        return f"MasterKey(id={self.key_id})"

    def wrap(self, data_key: bytes, key_id: str, tenant: str, subject: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data_key, wrapping_context(key_id, tenant, subject))

    def unwrap(self, wrapped: bytes, wrapped_by: str, key_id: str, tenant: str, subject: str) -> bytes:
        """The data key ``key_id``; WrongMasterKey when this key did not wrap it (or it was altered)."""
        if wrapped_by != self.key_id:
            raise WrongMasterKey(reason=f"data key {key_id} is wrapped under master key {wrapped_by}, not the "
                                 f"configured {self.key_id}: configure the key that wrapped it, or rewrap the data "
                                 "keys with `commitline keys rotate`")
        try:
            return self._aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:],
                                      wrapping_context(key_id, tenant, subject))
        except InvalidTag:
            raise WrongMasterKey(reason=f"the configured master key {self.key_id} does not unwrap data key "
                                 f"{key_id}: its row was altered, or another key with the same id wrapped it") \
                from None


class MasterKeys:
    """The master key (``current``), and during a rolling rotation the one before it (``previous``, from
    ``COMMITLINE_PREVIOUS_MASTER_KEY``): a data key is unwrapped with whichever of them wrapped it, and new data
    keys are wrapped under ``current`` only. ``key_id`` is the current key's."""

    __slots__ = ("current", "previous")

    def __init__(self, current: MasterKey, previous: MasterKey | None = None):
        self.current = current
        self.previous = previous if previous is not None and previous.key_id != current.key_id else None

    @property
    def key_id(self) -> str:
        return self.current.key_id

    @property
    def key_ids(self) -> tuple[str, ...]:
        return (self.current.key_id,) + ((self.previous.key_id,) if self.previous is not None else ())

    def __repr__(self) -> str:
        return f"MasterKeys(current={self.current.key_id}, previous={self.previous and self.previous.key_id})"

    def wrap(self, data_key: bytes, key_id: str, tenant: str, subject: str) -> bytes:
        return self.current.wrap(data_key, key_id, tenant, subject)

    def unwrap(self, wrapped: bytes, wrapped_by: str, key_id: str, tenant: str, subject: str) -> bytes:
        if self.previous is not None and wrapped_by == self.previous.key_id:
            return self.previous.unwrap(wrapped, wrapped_by, key_id, tenant, subject)
        if self.previous is not None and wrapped_by != self.current.key_id:
            raise WrongMasterKey(reason=f"data key {key_id} is wrapped under master key {wrapped_by}, neither the "
                                 f"configured {self.current.key_id} nor the previous {self.previous.key_id}: "
                                 "configure the key that wrapped it as COMMITLINE_PREVIOUS_MASTER_KEY")
        return self.current.unwrap(wrapped, wrapped_by, key_id, tenant, subject)


def generate() -> str:
    """A new master key, as ``COMMITLINE_MASTER_KEY`` takes it."""
    return base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def development_key(data_dir: Path) -> MasterKey:
    """The data folder's development key (for the embedded PostgreSQL only), made on first use (0600)."""
    path = Path(data_dir) / DEVELOPMENT_KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{DEVELOPMENT_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(generate() + "\n")
        try:
            os.link(temporary, path)  # never replaces a key another process made first
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    key = MasterKey.parse(path.read_text())
    key.origin = path
    return key
