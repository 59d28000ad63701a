"""The global transaction id of one partition's prepared transaction.

    sqlsink_<sink id>_<batch>_<partition>_<run>_<attempt>            part 0
    sqlsink_<sink id>_<batch>_<partition>_<run>_<attempt>_p<part>    part 1 .. 999

The part is which DataFrame (or table) of a batch the partition belongs to: a
batch of the foreachBatch writer can write several (``ForeachBatchWriter.batch``),
each a Spark job of its own whose partitions are numbered from 0 again. Part 0
keeps the original six-field form, so every gid written before parts existed,
and every gid of the data source (always part 0), reads the same as before; a
part above 0 adds a seventh field. Each gid has exactly one spelling (``_p0`` is
not ours). All parts of a batch are one batch: one decision names them all.

The sink id (letters, digits, '-') and the run id (a Spark run id, a uuid) hold no
underscore, so the six fields split unambiguously. The run id and the task attempt
make a gid unique per run and attempt: a replay or a retry never reuses a gid
that may still be prepared (Spark's task attempt ids restart after a driver restart,
run ids do not repeat). ``Gid.parse`` never raises: whatever it cannot read as one
of ours, including a foreign gid made to look similar, is ``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlsink.errors import ConfigError

PREFIX = "sqlsink"
MAX_GID_BYTES = 199  # PostgreSQL's limit (GIDSIZE - 1)
_SINK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
_NUMBER = re.compile(r"0|[1-9][0-9]{0,18}")
BIGINT_MAX = 2**63 - 1  # batch and attempt live in bigint columns of the commit log
INTEGER_MAX = 2**31 - 1  # the partition in an integer column
MAX_PART = 999  # so that the longest gid still fits MAX_GID_BYTES
_PART = re.compile(r"p([1-9][0-9]{0,2})")


def check_sink_id(sink_id: str) -> str:
    """The sink id, or a ConfigError that says what a sink id may hold."""
    if not _SINK_ID.fullmatch(sink_id):
        raise ConfigError(
            f"invalid sinkId {sink_id[:80]!r}: use 1 to 64 letters, digits and '-' "
            "(it becomes part of PostgreSQL transaction ids and of the commit log)"
        )
    return sink_id


@dataclass(frozen=True, order=True)
class Gid:
    sink_id: str
    batch_id: int
    partition_id: int
    run_id: str
    attempt_id: int
    part: int = 0  # which DataFrame of the batch (0: the only one, or the first)

    def __post_init__(self) -> None:
        check_sink_id(self.sink_id)
        if not _RUN_ID.fullmatch(self.run_id):
            raise ConfigError(f"invalid run id {self.run_id[:80]!r} for a transaction id")
        if min(self.batch_id, self.partition_id, self.attempt_id) < 0:
            raise ConfigError(f"negative number in transaction id fields: {self!r}")
        if max(self.batch_id, self.attempt_id) > BIGINT_MAX or self.partition_id > INTEGER_MAX:
            raise ConfigError(f"number out of range in transaction id fields: {self!r}")
        if not 0 <= self.part <= MAX_PART:
            raise ConfigError(f"part {self.part} of a batch is out of range 0..{MAX_PART}")

    def __str__(self) -> str:
        text = (
            f"{PREFIX}_{self.sink_id}_{self.batch_id}_{self.partition_id}"
            f"_{self.run_id}_{self.attempt_id}"
        )
        return f"{text}_p{self.part}" if self.part else text

    @classmethod
    def parse(cls, text: str) -> Gid | None:
        """The Gid that ``text`` names, or None for anything that is not exactly one of ours."""
        parts = text.split("_")
        if len(parts) not in (6, 7) or parts[0] != PREFIX or len(text.encode()) > MAX_GID_BYTES:
            return None
        part = 0
        if len(parts) == 7:
            match = _PART.fullmatch(parts.pop())
            if match is None:
                return None
            part = int(match.group(1))
        _, sink_id, batch, partition, run_id, attempt = parts
        if not (_SINK_ID.fullmatch(sink_id) and _RUN_ID.fullmatch(run_id)):
            return None
        if not all(_NUMBER.fullmatch(n) for n in (batch, partition, attempt)):
            return None
        numbers = int(batch), int(partition), int(attempt)
        if max(numbers[0], numbers[2]) > BIGINT_MAX or numbers[1] > INTEGER_MAX:
            return None  # a look-alike: ours always fit the commit log's columns
        return cls(sink_id, numbers[0], numbers[1], run_id, numbers[2], part)

    @staticmethod
    def sink_prefix(sink_id: str) -> str:
        """What every gid of this sink starts with (for a LIKE pre-filter; parse decides)."""
        return f"{PREFIX}_{check_sink_id(sink_id)}_"
