"""sqlsink: an exactly-once Spark Structured Streaming sink into PostgreSQL.

import sqlsink
sqlsink.register(spark)
events.writeStream.format("sqlsink").option("url", ...).option("table", ...).start()

or, from foreachBatch (several tables, update mode):

writer = sqlsink.ForeachBatchWriter(url=..., sink_id="orders")
events.writeStream.foreachBatch(writer.to("public.orders")).start()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlsink.errors import (
    CommitError,
    ConfigError,
    DataLossError,
    SinkBindingError,
    SqlsinkError,
    TransientError,
    WriteError,
)

if TYPE_CHECKING:
    from sqlsink.spark.foreach_batch import ForeachBatchWriter

__version__ = "0.1.0"

__all__ = [
    "CommitError",
    "ConfigError",
    "DataLossError",
    "ForeachBatchWriter",
    "SinkBindingError",
    "SqlsinkError",
    "TransientError",
    "WriteError",
    "register",
]


def __getattr__(name: str) -> Any:
    """``sqlsink.ForeachBatchWriter`` is imported when first asked for: every Python worker
    of ``format("sqlsink")`` imports this package, and none of them needs the writer's
    modules (tests/unit/test_worker_imports.py)."""
    if name == "ForeachBatchWriter":
        from sqlsink.spark.foreach_batch import ForeachBatchWriter

        return ForeachBatchWriter
    raise AttributeError(f"module 'sqlsink' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy name too, for completion and ``help()`` (found by an attack)."""
    return sorted({*globals(), *__all__})


def register(spark: Any) -> None:
    """Register the "sqlsink" data source with a SparkSession (PySpark 4.1 or later;
    on older versions a ConfigError names the version and the foreachBatch writer)."""
    from sqlsink.spark.support import require_data_source

    require_data_source()
    from sqlsink.spark.datasource import register as _register

    _register(spark)
