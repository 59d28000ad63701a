"""Which PySpark each entry point needs, checked where it is used (docs/deployment/index.md).

PySpark is the user's, not a dependency of the package: a job runs with its
cluster's PySpark, and ``pip install sqlsink`` must neither replace a Spark 3.5
environment's pyspark nor refuse to install beside a pinned one (the extra
``sqlsink[spark]`` brings one for local development). So the version is checked
when an entry point is used, and an unsupported one gets a sentence naming the
version it needs and the entry point that works instead:

- ``format("sqlsink")`` (``sqlsink.register``): PySpark 4.1 or later, the first with
  the Python data source's streaming Arrow writer (``DataSourceStreamArrowWriter``);
- the foreachBatch writer: PySpark 3.5 or later (``mapInArrow`` and Spark's local
  properties on the foreachBatch thread), through Spark Connect on 4.0 or later.
"""

from __future__ import annotations

import re

from sqlsink.errors import ConfigError

DATA_SOURCE = (4, 1)
FOREACH_BATCH = (3, 5)
CONNECT = (4, 0)

_INSTALL = (
    "install the PySpark your cluster runs (pip install 'pyspark==<its version>'), or "
    "pip install 'sqlsink[spark]' for local development"
)


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a PySpark version string such as ``3.5.8`` or ``4.1.0.dev0``."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ConfigError(f"sqlsink: cannot read the PySpark version {text!r}")
    return int(match[1]), int(match[2])


def pyspark_version() -> str:
    """The installed PySpark's version; a clear error when there is none."""
    try:
        import pyspark
    except ImportError:
        raise ConfigError(f"sqlsink: PySpark is not installed here: {_INSTALL}") from None
    return str(pyspark.__version__)


def _shown(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def is_connect(session: object) -> bool:
    """Whether a SparkSession is a Spark Connect client's (its Python workers, and the
    foreachBatch function, run on the Connect server)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def require_data_source(version: str | None = None) -> None:
    """``format("sqlsink")`` needs PySpark 4.1 or later."""
    text = version or pyspark_version()
    if parse_version(text) >= DATA_SOURCE:
        return
    raise ConfigError(
        f"sqlsink: format('sqlsink') needs PySpark {_shown(DATA_SOURCE)} or later (the "
        f"Python data source's streaming Arrow writer); this is PySpark {text}. Use the "
        f"foreachBatch writer instead (sqlsink.ForeachBatchWriter, PySpark "
        f"{_shown(FOREACH_BATCH)} or later, the same exactly-once protocol), or upgrade "
        "PySpark",
        pyspark=text,
        needs=_shown(DATA_SOURCE),
    )


def require_foreach_batch(version: str | None = None, *, connect: bool = False) -> None:
    """The foreachBatch writer needs PySpark 3.5 or later (4.0 through Spark Connect)."""
    text = version or pyspark_version()
    needed = CONNECT if connect else FOREACH_BATCH
    if parse_version(text) >= needed:
        return
    how = "through Spark Connect " if connect else ""
    raise ConfigError(
        f"sqlsink: the foreachBatch writer {how}needs PySpark {_shown(needed)} or later; "
        f"this is PySpark {text}: upgrade PySpark",
        pyspark=text,
        needs=_shown(needed),
    )
