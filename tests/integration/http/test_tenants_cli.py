"""``commitline tenants add|list|revoke`` as a real subprocess on a real PostgreSQL: a key is printed once
and stored only as its hash, listings never show a key nor its hash, revocation by key id or for the
whole tenant, and a bad tenant name refused with a typed error."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import orjson
import psycopg
import pytest

from commitline.composition import bootstrap
from tests.integration.http.conftest import cli_env
from tests.support import settings_for

KEY = re.compile(r"clk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")


def tenants(pg_dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commitline.cli", "tenants", *args], capture_output=True, text=True,
                          env=cli_env(pg_dsn, schema), timeout=120)


def secrets_of(key: str) -> list[str]:
    """Every form of a key that must not be shown: itself, its secret part, its hash (hex)."""
    digest = hashlib.sha256(key.encode()).digest()
    return [key, key[len("clk_0123456789ab_"):], digest.hex(), digest.hex().upper()]


def test_add_prints_the_key_once_and_stores_only_its_hash(pg_dsn: str, schema: str) -> None:
    added = tenants(pg_dsn, schema, "add", "acme")
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()
    match = KEY.fullmatch(key)
    assert match, added.stdout
    assert added.stdout == key + "\n"  # stdout is the key alone, for scripts: key=$(commitline tenants add acme)
    assert match.group(1) in added.stderr and key not in added.stderr

    as_json = tenants(pg_dsn, schema, "add", "acme", "--json")
    assert as_json.returncode == 0, as_json.stderr
    made = orjson.loads(as_json.stdout)
    assert set(made) == {"tenant", "key_id", "admin", "api_key", "created_at", "revoked_at"}
    assert made["tenant"] == "acme" and made["revoked_at"] is None and made["admin"] is False
    assert KEY.fullmatch(made["api_key"]).group(1) == made["key_id"]  # type: ignore[union-attr]
    assert made["api_key"] != key

    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f'SELECT key_id, tenant, key_hash, created_at, revoked_at FROM "{schema}".api_keys '
                            "ORDER BY created_at").fetchall()
        columns = [c.name for c in conn.execute(f'SELECT * FROM "{schema}".api_keys LIMIT 0').description or ()]
    assert columns == ["key_id", "tenant", "key_hash", "created_at", "revoked_at", "admin"]
    assert [(r[0], r[1], bytes(r[2])) for r in rows] == [
        (match.group(1), "acme", hashlib.sha256(key.encode()).digest()),
        (made["key_id"], "acme", hashlib.sha256(made["api_key"].encode()).digest()),
    ]
    stored = repr(rows)
    for secret in (key, made["api_key"]):
        assert secret not in stored and secret[len("clk_0123456789ab_"):] not in stored


def test_list_shows_key_ids_never_keys_or_hashes(pg_dsn: str, schema: str) -> None:
    keys = {t: tenants(pg_dsn, schema, "add", t).stdout.strip() for t in ("acme", "beta")}
    table = tenants(pg_dsn, schema, "list")
    assert table.returncode == 0, table.stderr
    listed = orjson.loads(tenants(pg_dsn, schema, "list", "--json").stdout)
    only_beta = orjson.loads(tenants(pg_dsn, schema, "list", "beta", "--json").stdout)
    for tenant, key in keys.items():
        key_id = KEY.fullmatch(key).group(1)  # type: ignore[union-attr]
        assert key_id in table.stdout and tenant in table.stdout
        assert {"tenant": tenant, "key_id": key_id, "revoked_at": None}.items() <= next(
            row for row in listed if row["key_id"] == key_id).items()
        for secret in secrets_of(key):
            assert secret not in table.stdout + table.stderr
            assert secret not in orjson.dumps(listed).decode()
    assert [row["tenant"] for row in listed] == ["acme", "beta"]
    assert set(listed[0]) == {"tenant", "key_id", "admin", "created_at", "revoked_at"}
    assert [row["tenant"] for row in only_beta] == ["beta"]


def test_revoke_one_key_then_all(pg_dsn: str, schema: str) -> None:
    first, second, third = (tenants(pg_dsn, schema, "add", "acme").stdout.strip() for _ in range(3))
    other = tenants(pg_dsn, schema, "add", "beta").stdout.strip()
    ids = [KEY.fullmatch(k).group(1) for k in (first, second, third, other)]  # type: ignore[union-attr]

    one = tenants(pg_dsn, schema, "revoke", "acme", "--key", ids[0])
    assert one.returncode == 0, one.stderr
    assert one.stdout == f"revoked {ids[0]} of tenant acme\n"

    def revoked() -> dict[str, bool]:
        rows = orjson.loads(tenants(pg_dsn, schema, "list", "--json").stdout)
        return {row["key_id"]: row["revoked_at"] is not None for row in rows}

    assert revoked() == {ids[0]: True, ids[1]: False, ids[2]: False, ids[3]: False}

    again = tenants(pg_dsn, schema, "revoke", "acme", "--key", ids[0])
    assert again.returncode == 1 and f"no active key {ids[0]} to revoke (revoked already" in again.stderr
    pasted = tenants(pg_dsn, schema, "revoke", "acme", "--key", second)  # the whole key, as in a leak: its id counts
    assert pasted.returncode == 0 and pasted.stdout == f"revoked {ids[1]} of tenant acme\n", pasted.stderr
    assert second.split("_")[-1] not in pasted.stdout + pasted.stderr
    assert revoked()[ids[1]] is True
    not_theirs = tenants(pg_dsn, schema, "revoke", "acme", "--key", ids[3])  # beta's key, named as acme's
    assert not_theirs.returncode == 1
    assert revoked()[ids[3]] is False

    everything = tenants(pg_dsn, schema, "revoke", "acme", "--json")
    assert everything.returncode == 0, everything.stderr
    assert sorted(row["key_id"] for row in orjson.loads(everything.stdout)) == [ids[2]]
    assert revoked() == {ids[0]: True, ids[1]: True, ids[2]: True, ids[3]: False}
    nothing_left = tenants(pg_dsn, schema, "revoke", "acme")
    assert nothing_left.returncode == 1 and "no active key" in nothing_left.stderr
    refused = tenants(pg_dsn, schema, "revoke", "acme", "--json")  # a refusal says nothing on stdout, JSON or not
    assert (refused.returncode, refused.stdout) == (1, "") and "no active key" in refused.stderr


@pytest.mark.parametrize("args", [
    ("add", "bad name"), ("add", "a/b"), ("add", "x" * 65), ("add", "é"), ("add", ""),
    ("list", "bad name"), ("revoke", "bad name"), ("revoke", "a;b", "--key", "0123456789ab"),
])
def test_an_invalid_tenant_name_is_a_typed_error(pg_dsn: str, schema: str, args: tuple[str, ...]) -> None:
    out = tenants(pg_dsn, schema, *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    error = orjson.loads(out.stderr.strip().splitlines()[-1])
    assert error["code"] == "invalid_tenant" and error["error"] == "InvalidTenant"
    assert "letters, digits" in error["message"]
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".api_keys').fetchone() == (0,)


def test_add_admin_makes_an_administrative_key_and_list_says_which(pg_dsn: str, schema: str) -> None:
    ordinary = tenants(pg_dsn, schema, "add", "acme", "--json")
    admin = tenants(pg_dsn, schema, "add", "acme", "--admin", "--json")
    assert admin.returncode == 0, admin.stderr
    made = orjson.loads(admin.stdout)
    assert made["admin"] is True and orjson.loads(ordinary.stdout)["admin"] is False
    listed = {row["key_id"]: row["admin"] for row in orjson.loads(tenants(pg_dsn, schema, "list", "--json").stdout)}
    assert listed == {orjson.loads(ordinary.stdout)["key_id"]: False, made["key_id"]: True}
    plain = tenants(pg_dsn, schema, "add", "acme", "--admin")
    assert "administrative API key" in plain.stderr and KEY.fullmatch(plain.stdout.strip())


def test_keys_made_before_administrative_keys_existed_stay_ordinary_and_valid(pg_dsn: str, schema: str) -> None:
    key = tenants(pg_dsn, schema, "add", "acme").stdout.strip()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the store as migration 9 left it
        conn.execute(f'ALTER TABLE "{schema}".api_keys DROP COLUMN admin')
        conn.execute(f'DELETE FROM "{schema}".schema_migrations WHERE version >= 10')
    listed = tenants(pg_dsn, schema, "list", "--json")  # a start applies migration 10 (and those after it)
    assert listed.returncode == 0, listed.stderr
    assert [(row["tenant"], row["admin"]) for row in orjson.loads(listed.stdout)] == [("acme", False)]
    with bootstrap(settings_for(pg_dsn, schema)) as app:
        found = app.api_keys().resolve(key)
    assert found is not None and (found.tenant, found.admin) == ("acme", False)
