"""PySpark is the user's: the package imports without it, and each entry point names the
version it needs (sqlsink/spark/support.py); the Arrow schema is sqlsink's own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sqlsink.errors import ConfigError
from sqlsink.spark import support


def test_versions_are_read_as_major_and_minor() -> None:
    assert support.parse_version("3.5.9") == (3, 5)
    assert support.parse_version("4.1.0.dev0") == (4, 1)
    with pytest.raises(ConfigError, match="cannot read the PySpark version"):
        support.parse_version("dev")


@pytest.mark.parametrize("version", ["3.5.9", "4.0.5"])
def test_the_data_source_on_an_older_pyspark_names_the_version_and_the_writer(
    version: str,
) -> None:
    with pytest.raises(ConfigError) as caught:
        support.require_data_source(version)
    assert str(caught.value) == (
        "sqlsink: format('sqlsink') needs PySpark 4.1 or later (the Python data source's "
        f"streaming Arrow writer); this is PySpark {version}. Use the foreachBatch writer "
        "instead (sqlsink.ForeachBatchWriter, PySpark 3.5 or later, the same exactly-once "
        "protocol), or upgrade PySpark"
    )


def test_the_foreach_batch_writer_needs_3_5_and_4_0_through_connect() -> None:
    support.require_foreach_batch("3.5.0")
    support.require_data_source("4.1.4")
    with pytest.raises(ConfigError, match=r"needs PySpark 3\.5 or later; this is PySpark 3\.4\.4"):
        support.require_foreach_batch("3.4.4")
    with pytest.raises(ConfigError, match=r"through Spark Connect needs PySpark 4\.0 or later"):
        support.require_foreach_batch("3.5.9", connect=True)


def test_sqlsink_and_its_cli_import_without_pyspark_and_say_what_to_install() -> None:
    program = textwrap.dedent(
        """
        import sys

        class NoPySpark:
            def find_spec(self, name, path=None, target=None):
                if name == "pyspark" or name.startswith("pyspark."):
                    raise ImportError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoPySpark())
        import sqlsink, sqlsink.cli
        for call in (
            lambda: sqlsink.ForeachBatchWriter(url="postgresql://u@h/db", sink_id="a"),
            lambda: sqlsink.register(None),
        ):
            try:
                call()
            except sqlsink.ConfigError as exc:
                print(exc)
        """
    )
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    sentence = (
        "sqlsink: PySpark is not installed here: install the PySpark your cluster runs (pip "
        "install 'pyspark==<its version>'), or pip install 'sqlsink[spark]' for local "
        "development"
    )
    assert run.stdout.splitlines() == [sentence, sentence]


def test_the_arrow_schema_is_the_one_spark_sends() -> None:
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    from sqlsink.spark.types import arrow_schema

    nested = T.StructType(
        [T.StructField("x", T.DecimalType(10, 2)), T.StructField("y", T.DateType())]
    )
    schema = T.StructType(
        [
            T.StructField("flag", T.BooleanType()),
            T.StructField("tiny", T.ByteType()),
            T.StructField("small", T.ShortType()),
            T.StructField("int", T.IntegerType()),
            T.StructField("big", T.LongType(), nullable=False),
            T.StructField("real", T.FloatType()),
            T.StructField("double", T.DoubleType()),
            T.StructField("text", T.StringType()),
            T.StructField("bytes", T.BinaryType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField("span", T.DayTimeIntervalType()),
            T.StructField("list", T.ArrayType(nested, containsNull=False)),
            T.StructField("map", T.MapType(T.StringType(), T.LongType())),
            T.StructField("nothing", T.NullType()),
        ]
    )
    assert arrow_schema(schema) == to_arrow_schema(schema, timezone="UTC")


def test_a_type_without_an_arrow_form_names_its_column() -> None:
    from pyspark.sql import types as T

    from sqlsink.spark.types import arrow_type

    with pytest.raises(ConfigError, match=r"column 'v': Spark type .* cannot be written"):
        arrow_type(T.CalendarIntervalType(), "v")
