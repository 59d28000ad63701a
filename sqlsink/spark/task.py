"""Who is writing one partition: the task attempt, as Spark's TaskContext says."""

from __future__ import annotations

from sqlsink.core.model import TaskIdentity
from sqlsink.errors import ConfigError


def current_task(
    sink_id: str,
    batch_id: int,
    run_id: str,
    query_id: str | None,
    part: int = 0,
    writer_token: str | None = None,
) -> TaskIdentity:
    """The identity of the Spark task attempt this code runs in (executor side only)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise ConfigError("sqlsink: a partition write outside a Spark task")
    return TaskIdentity(
        sink_id=sink_id,
        batch_id=batch_id,
        partition_id=ctx.partitionId(),
        run_id=run_id,
        attempt_id=ctx.taskAttemptId(),
        attempt_number=ctx.attemptNumber(),
        query_id=query_id,
        part=part,
        writer_token=writer_token,
    )
