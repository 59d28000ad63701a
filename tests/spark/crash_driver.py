"""A streaming driver in its own process, to be killed for real by an armed fault.

    python -m tests.spark.crash_driver [--master M] [--schema S] SOURCE CHECKPOINT URL TABLE
        [OPTION=VALUE ...]

Run it with SQLSINK_FAULTS_FILE set and in a new session (process group): a
``kill`` fault SIGKILLs this driver, its JVM and its Python workers together.
The master is ``local[2]`` (a failed task fails the query) unless ``--master``
says otherwise, e.g. ``local[2,4]`` (a task may fail 4 times: Spark retries it). The
source is read with ``streams.SCHEMA`` unless ``--schema`` gives another DDL schema.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    args = sys.argv[1:]
    master = "local[2]"
    if args[:1] == ["--master"]:
        master, args = args[1], args[2:]
    from tests.spark.streams import SCHEMA, local_session, run_query

    schema = SCHEMA
    if args[:1] == ["--schema"]:
        schema, args = args[1], args[2:]
    source, checkpoint, url, table = args[:4]
    extra = dict(arg.split("=", 1) for arg in args[4:])
    spark = local_session("sqlsink-crash-driver", master=master)
    options = {"url": url, "table": table, "createTable": "true", **extra}
    run_query(spark, Path(source), Path(checkpoint), options, schema=schema)
    print("drained without being killed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
