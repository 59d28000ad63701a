"""Upsert inside a partition's XA branch on MariaDB (postgres/upsert.py's role).

The rows go first to a staging table, then to the target by key, in the branch:

    before XA START (same session):
        CREATE TEMPORARY TABLE stage (UNIQUE KEY (key)) SELECT the written columns
            FROM target LIMIT 0    (their types and NOT NULLs; plus the delete flag)
    in the branch:
        LOAD DATA LOCAL INFILE (the FIFO, as append) REPLACE INTO stage
            REPLACE keeps, of the rows of a key, the last one sent: the last row of a
            key in the partition wins, as PostgreSQL's ordinal does
        DELETE target FROM stage STRAIGHT_JOIN target ON key WHERE the flag is set
            (the stage drives: each flagged key looked up in the target's unique index;
            a scan of the target would wait on rows of other partitions' prepared
            branches, which keep their row locks until the batch's commit)
        INSERT INTO target SELECT ... FROM stage WHERE the flag is not set
            ON DUPLICATE KEY UPDATE every written non-key column
            (every column a key: key = key, an update that changes nothing)

Why a temporary table: it is the session's own (a retry or a speculative attempt of
the same partition has its own, so their rows never mix nor wait on each other's
locks), it costs no binary log (row format logs no temporary table) and no redo, and
MariaDB 10.11 prepares and commits a branch that used one created before XA START
(tests/mariadb/test_upsert.py). It is dropped when the session ends, which is right
after XA PREPARE. DDL on an ordinary table would commit the branch implicitly, so a
shared staging table would have to exist beforehand and hold every attempt's rows
apart. Measured against multi-row INSERT ... ON DUPLICATE KEY UPDATE by
benchmarks/mariadb_upsert_paths.py (benchmarks/results/mariadb_upsert_paths.md).

MariaDB's ON DUPLICATE KEY UPDATE fires on a conflict with any unique index of the
table, not only the key's (PostgreSQL's ON CONFLICT (key) raises a unique violation for
another index): a staged row whose key is new but whose other unique columns are
another row's would update that other key's row, and its own key would never be stored.
So the update's first assignment is a guard: it keeps the key when the conflicting row
has the staged row's key, and otherwise evaluates a subquery of two rows, which fails
the statement (error 1242, ``COLLISION``; IF evaluates only the branch it takes):
nothing of the partition is written, and the error names the collision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

STAGE = "sqlsink_upsert_stage"  # a temporary table: the session's own
COLLISION = 1242  # "Subquery returns more than 1 row": the guard's failure
_FAIL = "(SELECT 1 UNION ALL SELECT 2)"


def quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class UpsertPlan:
    """The key (the table's spelling) and the DataFrame's delete flag, if any."""

    keys: tuple[str, ...]
    delete_column: str | None = None

    def stage(self, database: str) -> str:
        return f"{quote_name(database)}.{quote_name(STAGE)}"

    def create_stage(self, target: str, database: str, columns: Sequence[str]) -> list[str]:
        """The statements that make the session's staging table (before XA START):
        the written columns as the target has them, the flag, unique on the key."""
        written = [c for c in columns if c != self.delete_column]
        flag = f"{quote_name(self.delete_column)} BOOLEAN NULL, " if self.delete_column else ""
        keys = ", ".join(map(quote_name, self.keys))
        select = ", ".join(map(quote_name, written))
        return [
            f"DROP TEMPORARY TABLE IF EXISTS {self.stage(database)}",
            f"CREATE TEMPORARY TABLE {self.stage(database)} ({flag}UNIQUE KEY ({keys})) "
            f"ENGINE=InnoDB SELECT {select} FROM {target} LIMIT 0",
        ]

    def apply(self, target: str, database: str, columns: Sequence[str]) -> list[str]:
        """The statements that move the staged rows to the target (in the branch)."""
        stage = self.stage(database)
        written = [c for c in columns if c != self.delete_column]
        statements = []
        keep = ""
        if self.delete_column:
            flag = quote_name(self.delete_column)
            match = " AND ".join(f"t.{quote_name(k)} = s.{quote_name(k)}" for k in self.keys)
            # the staged rows first, each looking up its key: a scan of the target would
            # lock (and wait on) rows another partition's prepared branch holds
            statements.append(
                f"DELETE t FROM {stage} AS s STRAIGHT_JOIN {target} AS t ON {match} WHERE s.{flag}"
            )
            keep = f" WHERE s.{flag} IS NOT TRUE"
        lower_keys = {k.lower() for k in self.keys}
        updates = [c for c in written if c.lower() not in lower_keys]
        same = " AND ".join(
            f"{target}.{quote_name(k)} <=> VALUES({quote_name(k)})" for k in self.keys
        )
        first = quote_name(self.keys[0])
        guard = f"{first} = IF({same}, {target}.{first}, {_FAIL})"
        sets = ", ".join([guard] + [f"{quote_name(c)} = VALUES({quote_name(c)})" for c in updates])
        names = ", ".join(map(quote_name, written))
        s_names = ", ".join(f"s.{quote_name(c)}" for c in written)
        statements.append(
            f"INSERT INTO {target} ({names}) SELECT {s_names} FROM {stage} AS s{keep} "
            f"ON DUPLICATE KEY UPDATE {sets}"
        )
        return statements


def collision_message(table: str, keys: Sequence[str]) -> str:
    """The guard's failure in the sink's words (the caller says where)."""
    names = ", ".join(keys)
    return (
        f"a row of the batch has a new key ({names}) but the values of another unique index "
        f"of table {table} that a different row already has (in the table, or earlier in "
        "this partition): MariaDB's ON DUPLICATE KEY UPDATE would have updated that other "
        "row and lost this key, so the sink refused the partition (PostgreSQL refuses it as "
        "a unique violation); nothing of it is written. Fix: make the other unique "
        "columns agree with the key in the source, or drop that unique index, or write "
        "with mode=append"
    )
