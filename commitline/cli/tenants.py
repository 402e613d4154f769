"""``commitline tenants add|list|revoke``: the API keys that let a tenant call the HTTP API.

``add`` prints the new key once (only its hash is stored); a tenant may hold several keys, so a key is
rotated by adding the new one and revoking the old one by its id. ``add --admin`` makes an administrative
key: it may also erase the tenant's data subjects (``POST /v1/erasures``) and list its erasures.
"""

from __future__ import annotations

import argparse
import sys

from commitline.application.errors import CommitlineError, printable
from commitline.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, actions, console, error_exit, print_json


def _row(key) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {"tenant": key.tenant, "key_id": key.key_id, "admin": key.admin, "created_at": key.created_at.isoformat(),
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None}


def cmd_tenants(args: argparse.Namespace) -> int:
    from commitline.cli.common import bootstrap

    with bootstrap() as app:
        keys = app.api_keys()
        try:
            if args.tenants_command == "add":
                made = keys.add(args.name, admin=args.admin)
                if args.json:
                    print_json({**_row(made.key), "api_key": made.secret})
                else:
                    print(made.secret)
                    kind = "administrative API key" if made.key.admin else "API key"
                    print(f"{kind} {made.key.key_id} for tenant {made.key.tenant} of the domain {app.domain.name} "
                          f"(schema {app.settings.schema_name}): shown once, only its hash is kept. Use it as "
                          "Authorization: Bearer <key>.", file=sys.stderr)
                return EXIT_OK
            if args.tenants_command == "list":
                rows = [_row(k) for k in keys.list(args.name)]
                if args.json:
                    print_json(rows)
                    return EXIT_OK
                from rich.table import Table

                table = Table(title="API keys")
                for column in ("tenant", "key id", "admin", "created", "revoked"):
                    table.add_column(column)
                for r in rows:
                    table.add_row(str(r["tenant"]), str(r["key_id"]), "yes" if r["admin"] else "",
                                  str(r["created_at"]), str(r["revoked_at"] or ""))
                console().print(table)
                return EXIT_OK
            key_id = keys.key_id_in(args.key) if args.key is not None else None
            revoked = keys.revoke(args.name, key_id)
        except CommitlineError as e:
            return error_exit(e, EXIT_USAGE)
        if not revoked:  # a refusal: on stderr only, with or without --json (as every refusal)
            which = f"active key {printable(key_id)}" if key_id else "active key"
            print(f"tenant {args.name} has no {which} to revoke (revoked already, or not one of its keys)",
                  file=sys.stderr)
            return EXIT_REFUSED
        if args.json:
            print_json([_row(k) for k in revoked])
        for k in revoked if not args.json else ():
            print(f"revoked {k.key_id} of tenant {k.tenant}")
        return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tsub = actions(sub, "tenants", "tenants' API keys for the HTTP API: add, list, revoke")
    add = tsub.add_parser("add", help="make a new API key for tenant NAME and print it (once)",
                          description="NAME: 1-64 letters, digits, '.', '_' or '-'. The key decides the tenant of "
                          "every request made with it. A tenant may hold several keys.")
    add.add_argument("name", metavar="NAME", help="the tenant the key is for")
    add.add_argument("--admin", action="store_true", help="an administrative key: it may also erase the tenant's "
                     "data subjects over HTTP (POST /v1/erasures)")
    add.add_argument("--json", action="store_true", help='print {"tenant", "key_id", "admin", "api_key", ...}')
    listing = tsub.add_parser("list", help="every key (id, tenant, created, revoked); never the keys themselves")
    listing.add_argument("name", metavar="NAME", nargs="?", help="only this tenant's keys")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    revoke = tsub.add_parser("revoke", help="revoke tenant NAME's keys (or one of them); refused from the next request")
    revoke.add_argument("name", metavar="NAME", help="the tenant whose keys to revoke")
    revoke.add_argument("--key", metavar="KEY_ID", help="revoke only this key: its id, as `tenants list` shows (or "
                        "the whole key: only its id is read)")
    revoke.add_argument("--json", action="store_true", help="machine-readable output")
    for parser_ in (add, listing, revoke):
        parser_.set_defaults(run=cmd_tenants)
