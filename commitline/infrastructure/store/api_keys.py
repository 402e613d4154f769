"""Tenants' API keys: created, listed, revoked, and resolved to the tenant they belong to.

A key is ``clk_<key id>_<secret>``: the key id (12 hex digits) is public, shown by ``tenants list`` and
used to revoke one key; the secret (43 URL-safe characters, 256 random bits) is shown once, when the key
is made. Only the SHA-256 of the whole key is stored: the key has full entropy, so a slow password hash
would add latency to every request and no protection. A tenant may hold several keys (rotation: add the
new one, move the callers, revoke the old one). Resolving a key is one primary-key read, compared in
constant time (one round trip, no transaction around it), or a lookup in the serving process's cache of the
keys it resolved (``api_key_cache.py``), which every change to the table empties by notification: either way
a revoked key is refused from the next request on.

An administrative key (``admin``, made with ``tenants add NAME --admin``) may do everything an ordinary key of
its tenant may, and also erase the tenant's data subjects; whether a key is one is fixed when it is made.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.sql import SQL, Composed, Identifier, Literal

from commitline.application.boundary import check_tenant
from commitline.infrastructure.store.api_key_cache import ApiKeyCache
from commitline.infrastructure.store.small_table import SmallTable

API_KEYS_TABLE = "api_keys"
PREFIX = "clk_"


@dataclass(frozen=True)
class ApiKey:
    """A key as listed: its public id, never its secret or hash."""

    key_id: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None
    admin: bool = False

    @property
    def active(self) -> bool:
        return self.revoked_at is None


_KEY = re.compile(r"clk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")
_ID_OF_KEY = re.compile(r"clk_([0-9a-f]{12})(?:_.*)?", re.DOTALL)


def key_id_in(text: str) -> str:
    """The key id ``text`` names: itself, or the id inside a whole key (``clk_<id>_<secret>``) someone pasted where
    an id was asked for, so the secret is neither needed nor shown again."""
    match = _ID_OF_KEY.fullmatch(text.strip())
    return match.group(1) if match else text


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class NewApiKey:
    """A key just made: ``secret`` is the whole key, never stored and never shown again."""

    key: ApiKey
    secret: str


def create_statements(schema: str) -> list[Composed]:
    """The DDL of the keys table, for the schema migrations."""
    return [SQL("CREATE TABLE IF NOT EXISTS {} ("
                " key_id text PRIMARY KEY,"
                " tenant text NOT NULL,"
                " key_hash bytea NOT NULL,"
                " created_at timestamptz NOT NULL DEFAULT now(),"
                " revoked_at timestamptz)").format(Identifier(schema, API_KEYS_TABLE)),
            SQL("CREATE INDEX IF NOT EXISTS {} ON {} (tenant)").format(
                Identifier(f"{API_KEYS_TABLE}_tenant"), Identifier(schema, API_KEYS_TABLE))]


def admin_statements(schema: str) -> list[Composed]:
    """The DDL marking administrative keys (a later migration): every existing key is an ordinary one."""
    return [SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS admin boolean NOT NULL DEFAULT false").format(
        Identifier(schema, API_KEYS_TABLE))]


def changes_channel(schema: str) -> str:
    """The NOTIFY channel of changes to the schema's keys table (``change_notice_statements``)."""
    return f"{schema}_api_keys_changed"


def change_notice_statements(schema: str) -> list[Composed]:
    """The DDL of a later migration: every statement that updates, deletes or truncates keys, by whatever
    means, notifies ``changes_channel`` when it commits, so the processes caching keys drop them."""
    function = Identifier(schema, "api_keys_changed")
    return [SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN PERFORM pg_notify({}, ''); RETURN NULL; END $$").format(
                    function, Literal(changes_channel(schema))),
            SQL("DROP TRIGGER IF EXISTS api_keys_changed ON {}").format(Identifier(schema, API_KEYS_TABLE)),
            SQL("CREATE TRIGGER api_keys_changed AFTER UPDATE OR DELETE OR TRUNCATE ON {} "
                "FOR EACH STATEMENT EXECUTE FUNCTION {}()").format(Identifier(schema, API_KEYS_TABLE), function)]


_LISTED = "key_id, tenant, created_at, revoked_at, admin"


class ApiKeys(SmallTable):
    """The API keys of one schema, over any source of connections (``datastore.get_connection``)."""

    table_name = API_KEYS_TABLE

    def __init__(self, connection: Any, schema: str, cache: ApiKeyCache[ApiKey] | None = None):
        super().__init__(connection, schema)
        self.cache = cache  # resolved keys, when this process serves requests (None: every resolve reads)
        # Rendered once (identifiers quoted): every request resolves its key.
        self._resolving = SQL(f"SELECT {_LISTED}, key_hash FROM {{t}} WHERE key_id = %s AND revoked_at IS NULL"
                              ).format(t=self.table).as_string(None)

    def add(self, tenant: str, *, admin: bool = False) -> NewApiKey:
        """A new key for ``tenant`` (InvalidTenant for an unusable name); ``admin`` makes an administrative one."""
        tenant = check_tenant(tenant)
        key_id = secrets.token_hex(6)
        secret = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        (row,) = self._run("INSERT INTO {t} (key_id, tenant, key_hash, admin) VALUES (%s, %s, %s, %s) "
                           "RETURNING " + _LISTED, (key_id, tenant, digest(secret), admin))
        return NewApiKey(ApiKey(*row), secret)

    def list(self, tenant: str | None = None) -> list[ApiKey]:
        """Every key (of ``tenant`` only, if given), oldest first."""
        where, params = ("WHERE tenant = %s", (check_tenant(tenant),)) if tenant is not None else ("", ())
        rows = self._run(f"SELECT {_LISTED} FROM {{t}} {where} "
                         "ORDER BY created_at, key_id", params)
        return [ApiKey(*row) for row in rows]

    key_id_in = staticmethod(key_id_in)

    def revoke(self, tenant: str, key_id: str | None = None) -> list[ApiKey]:
        """Revoke ``tenant``'s active keys (only ``key_id``, if given: an id, or a whole key, ``key_id_in``);
        returns those revoked now."""
        query = "UPDATE {t} SET revoked_at = now() WHERE tenant = %s AND revoked_at IS NULL"
        params: tuple[Any, ...] = (check_tenant(tenant),)
        if key_id is not None:
            query, params = query + " AND key_id = %s", (*params, key_id_in(key_id))
        rows = self._run(query + " RETURNING " + _LISTED, params)
        if rows and self.cache is not None:  # other processes hear of it by notification; this one knows already
            self.cache.forget()
        return [ApiKey(*row) for row in rows]

    def tenant_for(self, key: str) -> str | None:
        """The tenant of an active key; None for anything else (malformed, unknown, revoked)."""
        found = self.resolve(key)
        return found.tenant if found is not None else None

    def resolve(self, key: str) -> ApiKey | None:
        """The active key ``key`` is (its id, tenant, whether it is administrative); None for anything else."""
        match = _KEY.fullmatch(key)
        if match is None:
            return None
        if self.cache is None:
            return self._stored(key, match.group(1))
        return self.cache.resolve(key, lambda: self._stored(key, match.group(1)))

    def _stored(self, key: str, key_id: str) -> ApiKey | None:
        rows = self._read(self._resolving, (key_id,))
        if not rows or not hmac.compare_digest(bytes(rows[0][-1]), digest(key)):
            return None
        return ApiKey(*rows[0][:-1])

    def close(self) -> None:
        """Stop caching (its listening connection closed); resolving reads every key from then on."""
        cache, self.cache = self.cache, None
        if cache is not None:
            cache.close()
