"""Upsert inside a partition's prepared transaction.

A transaction that touched a temporary table cannot be prepared, so the rows go
to a staging table created and dropped inside the transaction (never visible to
anyone else), with an ordinal column: the last row of a key in the batch wins.
The staging table is an ordinary, WAL-logged one, not UNLOGGED: with an UNLOGGED
staging table in a transaction that was prepared when the server crashed,
PostgreSQL 16.2's crash recovery failed while resetting unlogged relations
("could not create file …: File exists") and the server would not start (seen
in tests/chaos). Logging the staged rows costs WAL; a server that cannot restart
costs more. Then, in the same transaction:

    DELETE FROM target USING (last row per key) WHERE its delete flag is set
    INSERT INTO target SELECT last row per key WHERE not deleted
        ON CONFLICT (key) DO UPDATE SET every non-key column
        (DO NOTHING when every column is a key: an empty SET list is a syntax error)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from psycopg import sql

from sqlsink.postgres.catalog import TargetColumn
from sqlsink.tablename import TableName

ORDINAL = "__sqlsink_ord"
BIGINT_OID, BOOL_OID = 20, 16


@dataclass(frozen=True)
class UpsertPlan:
    keys: tuple[str, ...]
    delete_column: str | None = None

    def staging_name(self, gid: str) -> TableName:
        return TableName("sqlsink", "stage_" + hashlib.sha1(gid.encode()).hexdigest()[:24])

    def staging_columns(self, columns: tuple[TargetColumn, ...]) -> tuple[TargetColumn, ...]:
        """The written columns plus the ordinal (the delete flag is among the written)."""
        return (*columns, TargetColumn(ORDINAL, BIGINT_OID, "bigint", True, False))

    def create_staging(self, staging: TableName, columns: tuple[TargetColumn, ...]) -> sql.Composed:
        definitions = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type_name))
            for c in self.staging_columns(columns)
        )
        return sql.SQL("CREATE TABLE {} ({})").format(staging.identifier(), definitions)

    def apply(
        self, target: TableName, staging: TableName, columns: tuple[TargetColumn, ...]
    ) -> list[sql.Composed]:
        written = [c.name for c in columns if c.name != self.delete_column]
        keys = sql.SQL(", ").join(map(sql.Identifier, self.keys))
        latest = sql.SQL(
            "SELECT DISTINCT ON ({keys}) * FROM {staging} ORDER BY {keys}, {ord} DESC"
        ).format(keys=keys, staging=staging.identifier(), ord=sql.Identifier(ORDINAL))
        statements = []
        keep: sql.Composable = sql.SQL("true")
        if self.delete_column:
            flag = sql.Identifier(self.delete_column)
            match = sql.SQL(" AND ").join(
                sql.SQL("t.{k} = s.{k}").format(k=sql.Identifier(k)) for k in self.keys
            )
            statements.append(
                sql.SQL(
                    "DELETE FROM {target} AS t USING ({latest}) AS s WHERE s.{flag} AND {match}"
                ).format(target=target.identifier(), latest=latest, flag=flag, match=match)
            )
            keep = sql.SQL("s.{flag} IS NOT TRUE").format(flag=flag)
        updates = [c for c in written if c not in self.keys]
        on_conflict = (
            sql.SQL("DO UPDATE SET ")
            + sql.SQL(", ").join(
                sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in updates
            )
            if updates
            else sql.SQL("DO NOTHING")
        )
        cols = sql.SQL(", ").join(map(sql.Identifier, written))
        s_cols = sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(c)) for c in written)
        statements.append(
            sql.SQL(
                "INSERT INTO {target} ({cols}) SELECT {s_cols} FROM ({latest}) AS s WHERE {keep} "
                "ON CONFLICT ({keys}) {on_conflict}"
            ).format(
                target=target.identifier(), cols=cols, s_cols=s_cols, latest=latest, keep=keep,
                keys=keys, on_conflict=on_conflict,
            )
        )  # fmt: skip
        statements.append(sql.SQL("DROP TABLE {}").format(staging.identifier()))
        return statements
