"""Role and database names as SQL, for the fixes: quoted by the server wherever the
settings were read from one (``read_settings`` asks it, ``quote_ident()``); the pure
``quote_ident`` below is the fallback for settings built without a server."""

from __future__ import annotations

import re

from sqlsink.postgres.checks.model import ServerSettings

# the fallback only (settings read from a server carry its own quoting): keywords that
# may not be a role or database name unquoted (pg_get_keywords() catcode R, C, T,
# PostgreSQL 16 and 17); quoting one too many is harmless
_KEYWORD_TEXT = """
    all analyse analyze and any array as asc asymmetric authorization between bigint binary
    bit boolean both case cast char character check coalesce collate collation column
    concurrently constraint create cross current_catalog current_date current_role
    current_schema current_time current_timestamp current_user dec decimal default deferrable
    desc distinct do else end except exists extract false fetch float for foreign freeze from
    full grant greatest group grouping having ilike in initially inner inout int integer
    intersect interval into is isnull join json json_array json_arrayagg json_exists
    json_object json_objectagg json_query json_scalar json_serialize json_table json_value
    lateral leading least left like limit localtime localtimestamp merge_action national
    natural nchar none normalize not notnull null nullif numeric offset on only or order out
    outer overlaps overlay placing position precision primary real references returning right
    row select session_user setof similar smallint some substring symmetric system_user table
    tablesample then time timestamp to trailing treat trim true union unique user using values
    varchar variadic verbose when where window with xmlattributes xmlconcat xmlelement
    xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable"""
_KEYWORDS = frozenset(_KEYWORD_TEXT.split())
_PLAIN_IDENT = re.compile(r"[a-z_][a-z0-9_$]*")


def quote_ident(name: str) -> str:
    """A role or database name as SQL without a server: bare when it may be, else
    double-quoted (the fallback of ``role_sql`` and ``database_sql``)."""
    if _PLAIN_IDENT.fullmatch(name) and name not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def role_sql(settings: ServerSettings) -> str:
    """The login role as SQL: the server's quoting when read from one."""
    return settings.role_ident or quote_ident(settings.role)


def database_sql(settings: ServerSettings) -> str:
    """The database as SQL: the server's quoting when read from one."""
    return settings.database_ident or quote_ident(settings.database)
