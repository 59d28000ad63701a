"""A streaming driver in its own process, to be killed for real by an armed fault.

    python -m tests.spark.crash_driver SOURCE CHECKPOINT URL TABLE [OPTION=VALUE ...]

Run it with SQLSINK_FAULTS_FILE set and in a new session (process group): a
``kill`` fault SIGKILLs this driver, its JVM and its Python workers together.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> int:
    source, checkpoint, url, table = sys.argv[1:5]
    extra = dict(arg.split("=", 1) for arg in sys.argv[5:])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import sqlsink
    from tests.spark.streams import run_query

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlsink-crash-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sqlsink.register(spark)
    options = {"url": url, "table": table, "createTable": "true", **extra}
    run_query(spark, Path(source), Path(checkpoint), options)
    print("drained without being killed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
