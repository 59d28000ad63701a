"""A streaming driver in its own process, to be killed for real by an armed fault.

    python -m tests.spark.crash_driver SOURCE CHECKPOINT URL TABLE [OPTION=VALUE ...]

Run it with SQLSINK_FAULTS_FILE set and in a new session (process group): a
``kill`` fault SIGKILLs this driver, its JVM and its Python workers together.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    source, checkpoint, url, table = sys.argv[1:5]
    extra = dict(arg.split("=", 1) for arg in sys.argv[5:])
    from tests.spark.streams import local_session, run_query

    spark = local_session("sqlsink-crash-driver")
    options = {"url": url, "table": table, "createTable": "true", **extra}
    run_query(spark, Path(source), Path(checkpoint), options)
    print("drained without being killed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
