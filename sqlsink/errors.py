"""One error tree for the whole sink.

``TransientError``: retrying the batch (a task retry, a query restart) may succeed.
Anything else is terminal: retrying will fail the same way until someone acts;
the message says what to do. Every error pickles (Spark ships task errors from
executors to the driver), and carries no secret: messages are built from
redacted connection strings only.
"""

from __future__ import annotations

from typing import Any


class SqlsinkError(Exception):
    """Base of every error the sink raises on purpose."""

    transient = False

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.context))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[SqlsinkError], message: str, context: dict[str, Any]) -> SqlsinkError:
    return cls(message, **context)


class TransientError(SqlsinkError):
    """A failure that a retry of the batch may not meet again (lost connection, race)."""

    transient = True


class ConfigError(SqlsinkError):
    """Bad options, a missing table, a server setting the sink cannot work with."""


class SinkBindingError(SqlsinkError):
    """A sink id already bound to another streaming query (DESIGN.md invariant 8)."""


class DataLossError(SqlsinkError):
    """A decided transaction vanished without its marker: someone rolled it back."""


class WriteError(SqlsinkError):
    """A partition's rows could not be written; nothing of the batch became visible."""


class CommitError(TransientError):
    """The batch could not be decided; it is rolled back and Spark retries it."""


class CheckpointError(SqlsinkError):
    """The checkpoint and the commit log disagree: batches went back, or rows were lost."""


class FencedError(SqlsinkError):
    """A newer run of the sink exists: this one is a zombie and must stop (invariant 10)."""
