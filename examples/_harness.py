"""What every example needs and none is about: the command line, a Spark session, a
throw-away PostgreSQL, a scratch directory, and the printed verdict.

An example is its ``run(spark, url, workdir) -> dict`` (read that); its ``main()`` is
``return example_main(__doc__, "name", run)``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

Run = Callable[[Any, str, Path], dict[str, Any]]


def build_session(name: str) -> Any:
    """A ``local[2]`` SparkSession whose Python workers run this interpreter (the one with
    pyarrow and psycopg): PYSPARK_PYTHON must be set before the session starts."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def example_main(doc: str, name: str, run: Run, argv: list[str] | None = None) -> int:
    """Parse ``--url``, run the example in its own session and scratch directory, print
    the verdict; exit 0 when it is right, 1 when not."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--url", help="a PostgreSQL server to use instead of an embedded one")
    args = parser.parse_args(argv)
    spark = build_session(name)
    server = None
    try:
        url = args.url
        if url is None:  # a throw-away server with max_prepared_transactions > 0
            from sqlsink.embedded import EmbeddedPostgres

            server = EmbeddedPostgres().start()
            url = server.url()
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as workdir:
            verdict = run(spark, url, Path(workdir))
    finally:
        spark.stop()
        if server is not None:
            server.destroy()
    print()
    width = max(map(len, verdict)) + 2
    for key, value in verdict.items():
        print(f"{key:{width}} {value}")
    return 0 if verdict["ok"] else 1


def count_rows(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        found = row.fetchone()
    return int(found[0]) if found else 0


def prepared_left(url: str) -> int:
    """Prepared transactions left in the example's database (0 when all went well)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0
