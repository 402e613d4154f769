"""Which names cannot be a commitline schema, for ``COMMITLINE_SCHEMA`` and for ``commitline init``'s packages.

The ``eventsourcing`` library writes a schema's name unquoted into SQL (its composite types are looked up as
``schema.type``), so a PostgreSQL keyword that is not unreserved (``user``, ``order``, ``select``, ``int``) fails
there with a syntax error that reads like an outage. Such names, PostgreSQL's own (``pg_*``,
``information_schema``) and the ones the name pattern refuses are refused before anything is created.
``KEYWORDS``: ``SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'`` on PostgreSQL 18 (it holds 15's too).
"""

from __future__ import annotations

import re

SCHEMA_PATTERN = r"^[a-z_][a-z0-9_]{0,40}$"
_SCHEMA = re.compile(SCHEMA_PATTERN)

KEYWORDS = frozenset("""
    all analyse analyze and any array as asc asymmetric authorization between bigint binary bit boolean both
    case cast char character check coalesce collate collation column concurrently constraint create cross
    current_catalog current_date current_role current_schema current_time current_timestamp current_user dec
    decimal default deferrable desc distinct do else end except exists extract false fetch float for foreign
    freeze from full grant greatest group grouping having ilike in initially inner inout int integer intersect
    interval into is isnull join json json_array json_arrayagg json_exists json_object json_objectagg json_query
    json_scalar json_serialize json_table json_value lateral leading least left like limit localtime
    localtimestamp merge_action national natural nchar none normalize not notnull null nullif numeric offset on
    only or order out outer overlaps overlay placing position precision primary real references returning right
    row select session_user setof similar smallint some substring symmetric system_user table tablesample then
    time timestamp to trailing treat trim true union unique user using values varchar variadic verbose when
    where window with xmlattributes xmlconcat xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi
    xmlroot xmlserialize xmltable
""".split())


def schema_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a commitline schema, as words after it (``'user' is a PostgreSQL keyword, ...``);
    None when it can."""
    if not _SCHEMA.fullmatch(name):
        return "must be 1-41 lowercase letters, digits or '_'"
    if name.startswith("pg_"):
        return "begins with pg_, which PostgreSQL keeps for its own schemas"
    if name == "information_schema":
        return "is PostgreSQL's own schema"
    if name in KEYWORDS:
        return "is a PostgreSQL keyword, which cannot name a schema unquoted"
    return None
