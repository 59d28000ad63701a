"""The ``application_name`` of every session the sink opens: built and recognised here.

``pg_stat_activity`` shows these names; ``sqlsink status`` and ``recover`` read them
to tell which sessions belong to which sink. PostgreSQL keeps at most 63 bytes of
a name (NAMEDATALEN - 1), so a long sink id is recognised by what is left of it.
"""

from __future__ import annotations

LIMIT = 63
PREFIX = "sqlsink "
PLANNER = "sqlsink planner"
ONE_OFF = "sqlsink"


def _cut(name: str) -> str:
    return name.encode()[:LIMIT].decode(errors="ignore")


def task(sink_id: str, batch_id: int, partition_id: int) -> str:
    """A partition task's session."""
    return _cut(f"sqlsink sink {sink_id}, batch {batch_id}, partition {partition_id}")


def batch_tasks(sink_id: str, batch_id: int) -> str:
    """What every partition task's session of the batch is named with, and starts with."""
    return _cut(f"sqlsink sink {sink_id}, batch {batch_id}, partition ")


def committer(sink_id: str) -> str:
    """The driver's commit (or abort) session."""
    return _cut(f"sqlsink {sink_id} commit")


def cli(command: str) -> str:
    return _cut(f"sqlsink {command} (cli)")


def of_sink(name: str, sink_id: str) -> bool:
    """Whether a session of this name shows the sink live: one of its tasks or its committer.

    Names cut at 63 bytes are matched by what is left of them (a long sink id may then
    match a sibling's session too: that errs on the side of "live").
    """
    return name.startswith(_cut(f"sqlsink sink {sink_id}, batch ")) or name == committer(sink_id)
