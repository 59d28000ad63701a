"""The error's first line a failed run's end records (spark/listener.py): the sink's own
line out of the wrappers Spark puts around a query's error."""

from __future__ import annotations

from sqlsink.spark.listener import first_line

# the shape of a failed format("sqlsink") query's error as the listener gets it (Spark's
# exception string: its wrapper, the Python worker's traceback, JVM frames)
WRAPPED = """\
org.apache.spark.sql.streaming.StreamingQueryException: [STREAM_FAILED] Query [id = 1, \
runId = 2] terminated with exception: [PYTHON_EXCEPTION] An exception was thrown from the \
Python worker: Traceback (most recent call last):
  File "/x/sqlsink/postgres/partition.py", line 155, in _load
    raise _write_error(exc, options, target, task) from None
sqlsink.errors.WriteError: sink s, batch 1, partition 0: writing to table public.t failed
 SQLSTATE: 38000
\tat org.apache.spark.sql.execution.streaming.StreamExecution.runStream(StreamExecution.scala:1)
Caused by: org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/sqlsink/postgres/partition.py", line 155, in _load
sqlsink.errors.WriteError: sink s, batch 1, partition 0: writing to table public.t failed
\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)
"""


def test_the_sinks_own_line_out_of_sparks_wrappers() -> None:
    expected = (
        "sqlsink.errors.WriteError: sink s, batch 1, partition 0: writing to table public.t failed"
    )
    assert first_line(WRAPPED) == expected


def test_a_java_error_without_a_python_line_is_its_first_line() -> None:
    error = "java.lang.IllegalStateException: boom\n\tat a.b.C(C.java:1)\n"
    assert first_line(error) == "java.lang.IllegalStateException: boom"


def test_a_plain_message_and_nothing() -> None:
    assert first_line("\n  the query stopped badly  \nmore\n") == "the query stopped badly"
    assert first_line("") == ""
