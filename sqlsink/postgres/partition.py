"""One partition's transaction, on an executor.

exactly_once: connect; the participant's checks before the write (replay, binding,
leftovers: ``sqlsink.core.participant``); BEGIN; COPY the rows; insert the marker
row; PREPARE TRANSACTION gid; check the server really prepared (a failed
transaction answers PREPARE with the tag ROLLBACK); the participant's check after
PREPARE; close. On any error: ROLLBACK (never ROLLBACK PREPARED: after a failed
PREPARE that gid may be someone else's) and close.

at_least_once / none: the same load, committed directly (``none`` without waiting
for the WAL flush).
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from sqlsink.core.faults import crash_point
from sqlsink.core.gid import Gid
from sqlsink.core.model import KeyRange, PartitionOutcome, TaskIdentity
from sqlsink.core.participant import Participant, task_gid
from sqlsink.errors import ConfigError, SqlsinkError, TransientError, WriteError
from sqlsink.options import Mode, Semantic, SinkOptions
from sqlsink.postgres import appnames, commit_log, timing
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.catalog import TargetColumn
from sqlsink.postgres.connection import Connection, connect, scrub
from sqlsink.postgres.dead_letters import DeadLetters
from sqlsink.postgres.encoding import build_encoder, write_batches
from sqlsink.postgres.encoding.writer import CopyWriter
from sqlsink.postgres.faults import terminator
from sqlsink.postgres.locks import describe_holders, relation_lock_holders
from sqlsink.postgres.schema import privilege_error
from sqlsink.postgres.sessions import session
from sqlsink.postgres.target import TargetPlan
from sqlsink.postgres.upsert import ORDINAL
from sqlsink.tablename import TableName


def write_partition(
    options: SinkOptions,
    target: TargetPlan,
    task: TaskIdentity,
    batches: Iterable[pa.RecordBatch],
) -> PartitionOutcome:
    """Load the partition's rows; return what the committer needs to know."""
    if options.mode is Mode.REPLACE and task.partition_id != 0:
        raise ConfigError(
            f"{task.where()}: mode=replace writes a batch as one partition (each would "
            f"delete the others' rows); this is partition {task.partition_id}: write "
            "df.coalesce(1), as the foreachBatch writer does",
            batch=task.batch_id,
            partition=task.partition_id,
        )
    times = timing.begin()  # None unless SQLSINK_TIMING_DIR is set (benchmarks)
    rows_iter = iter(batches) if times is None else times.waited(iter(batches))
    first = _first_nonempty(rows_iter)
    # nothing to write: no transaction, no gid (costs nothing to commit); but an empty
    # replace is a batch that empties the table
    if first is None and options.mode is not Mode.REPLACE:
        now = time.time()
        return PartitionOutcome.of_task(task, None, 0, skipped=False, started=now)
    started = time.time()
    connecting = time.perf_counter() if times is not None else 0.0
    with session(
        options.url,
        options.password,
        application_name=appnames.task(task.sink_id, task.batch_id, task.partition_id),
    ) as conn:  # kept for the next batch after a clean use; after PREPARE, reused or
        # closed, the session leaves the transaction prepared
        backend = PostgresBackend(conn, options.lock_timeout_s)
        participant = Participant(backend, task, options.timeouts, options.run_timeout_s)
        try:
            start = participant.before_write()
        except psycopg.errors.InsufficientPrivilege as exc:
            raise privilege_error(conn, exc) from None
        if times is not None:
            times.add("session", time.perf_counter() - connecting)
        if start.skip or start.adopt:
            rest = itertools.chain([first] if first is not None else [], rows_iter)
            if start.skip or options.dead_letter_table is None:
                counted = sum(b.num_rows for b in rest)  # Spark wants it read
                if start.skip:
                    return PartitionOutcome.of_task(task, None, 0, skipped=True, started=started)
                return PartitionOutcome.of_task(
                    task, start.adopt, counted, skipped=False, started=started
                )
            # the adopted attempt kept its dead letters apart (its marker, which says how
            # many rows it wrote, is invisible until COMMIT PREPARED): judge the same rows
            # again, as it did, so the decision and the figures count what it wrote
            judged = DeadLetters(options.dead_letter_table, target.table, task, target.columns)
            rows = _judged_rows(judged, target.columns, rest)
            return PartitionOutcome.of_task(
                task,
                start.adopt,
                rows,
                skipped=False,
                started=started,
                dead_letters=len(judged.rows),
            )
        gid = task_gid(task) if options.semantic is Semantic.EXACTLY_ONCE else None
        given = itertools.chain([first] if first is not None else [], rows_iter)
        dead = (
            DeadLetters(options.dead_letter_table, target.table, task, target.columns)
            if options.dead_letter_table is not None
            else None
        )
        counted = _load(conn, backend, participant, options, target, gid, given, times, dead)
        rows = counted.rows - (len(dead.rows) if dead is not None else 0)
        if times is not None:
            times.save(batch=task.batch_id, partition=task.partition_id, rows=rows)
        return PartitionOutcome.of_task(
            task,
            str(gid) if gid else None,
            rows,
            skipped=False,
            started=started,
            key_range=counted.key_range(),
            dead_letters=len(dead.rows) if dead is not None else 0,
            bytes_sent=counted.sent,
        )


class _Discard:
    """A COPY that sends nothing: the rows are only judged and encoded."""

    def write(self, buffer: bytes | bytearray | memoryview) -> None:
        pass


def _judged_rows(
    dead: DeadLetters, columns: Sequence[TargetColumn], batches: Iterator[pa.RecordBatch]
) -> int:
    """The rows a write of ``batches`` would send (the others kept in ``dead``)."""
    screened = dead.screened(batches)
    first = next(screened, None)
    if first is None:
        return 0
    encoder = build_encoder(list(first.schema), list(columns))
    return write_batches(
        _Discard(), encoder, itertools.chain([first], screened), None, dead.take_row
    )


def _first_nonempty(batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch | None:
    for batch in batches:
        if batch.num_rows:
            return batch
    return None


def _load(
    conn: Connection,
    backend: PostgresBackend,
    participant: Participant,
    options: SinkOptions,
    target: TargetPlan,
    gid: Gid | None,
    batches: Iterator[pa.RecordBatch],
    times: timing.PartTimes | None = None,
    dead: DeadLetters | None = None,
) -> _Counter:
    """COPY the rows (without the dead letters, which go to their table in the same
    transaction), then the marker and PREPARE (or COMMIT)."""
    task = participant.task
    counted = _Counter(batches, target)
    upsert = target.upsert
    staging = upsert.staging_name(str(gid or uuid.uuid4())) if upsert else None
    try:
        with timing.phase(times, "begin"):
            conn.execute("BEGIN")
        if options.semantic is Semantic.NONE:
            conn.execute("SET LOCAL synchronous_commit = off")
        if upsert is not None and staging is not None:
            conn.execute(upsert.create_staging(staging, target.columns))
            given = _cut_mid_copy(counted, conn, task)
            numbered = _numbered(dead.screened(given) if dead is not None else given)
            columns = upsert.staging_columns(target.columns)
            counted.sent += _copy(conn, staging, columns, numbered, times, dead)
            for statement in upsert.apply(target.table, staging, target.columns):
                conn.execute(statement)
        else:
            if options.mode is Mode.REPLACE:  # the whole table, in the batch's transaction
                conn.execute(sql.SQL("DELETE FROM {}").format(target.table.identifier()))
            given = _cut_mid_copy(counted, conn, task)
            screened = dead.screened(given) if dead is not None else given
            counted.sent += _copy(conn, target.table, target.columns, screened, times, dead)
        if dead is not None:
            with timing.phase(times, "dead_letters"):
                dead.insert(conn)
        if gid is None:
            conn.execute("COMMIT")
            return counted
        written = counted.rows - (len(dead.rows) if dead is not None else 0)
        _prepare(conn, backend, task, gid, written, times)
        crash_point("after_prepare", task.batch_id, task.partition_id, task.attempt_number)
        with timing.phase(times, "after_prepare"):
            participant.after_prepare(gid)
        return counted
    except psycopg.Error as exc:
        _rollback_quietly(conn)
        raise _write_error(exc, options, target, task) from None
    except WriteError as exc:  # a value the encoder cannot write: say where
        _rollback_quietly(conn)
        raise WriteError(
            f"{task.where()}: writing to table {target.table} failed: {exc}. "
            f"Nothing of batch {task.batch_id} is visible.",
            **{**exc.context, "batch": task.batch_id, "partition": task.partition_id},
        ) from None
    except SqlsinkError:
        _rollback_quietly(conn)
        raise


def _prepare(
    conn: Connection,
    backend: PostgresBackend,
    task: TaskIdentity,
    gid: Gid,
    rows: int,
    times: timing.PartTimes | None = None,
) -> None:
    """The marker row (same transaction, same xid as the rows), then PREPARE TRANSACTION,
    bounded when a synchronous standby must confirm it."""
    with timing.phase(times, "marker"):
        commit_log.insert_marker(
            conn, str(gid), task.sink_id, task.batch_id, task.partition_id, rows
        )
    with (
        timing.phase(times, "prepare"),
        backend.standby.bounded(
            f"{task.where()}: PREPARE TRANSACTION {gid}",
            batch=task.batch_id,
            partition=task.partition_id,
            gid=str(gid),
        ),
        conn.cursor() as cur,
    ):
        cur.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(str(gid))))
        if cur.statusmessage != "PREPARE TRANSACTION":
            raise TransientError(
                f"{task.where()}: the server did not prepare transaction {gid} "
                f"(it answered {cur.statusmessage!r}); the batch is retried",
                gid=str(gid),
            )


def _copy(
    conn: Connection,
    table: TableName,
    columns: Sequence[TargetColumn],
    batches: Iterator[pa.RecordBatch],
    times: timing.PartTimes | None = None,
    dead: DeadLetters | None = None,
) -> int:
    """COPY the batches into ``table``; the bytes the COPY sent (its binary stream)."""
    names = sql.SQL(", ").join(sql.Identifier(c.name) for c in columns)
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(table.identifier(), names)
    first = next(batches, None)
    if first is None:  # an empty replace: nothing to copy
        return 0
    with conn.cursor() as cur:
        with cur.copy(statement) as copy:
            encoder = build_encoder(list(first.schema), list(columns))
            on_problem = dead.take_row if dead is not None else None
            sent = _Sent(copy)
            write_batches(sent, encoder, itertools.chain([first], batches), times, on_problem)
            ending = time.perf_counter() if times is not None else 0.0
        if times is not None:  # the end of COPY: the server's last rows
            times.add("copy_end", time.perf_counter() - ending)
    return sent.bytes


class _Sent:
    """A COPY's writer that counts what it sends (the batch figures' ``bytes_sent``): one
    call per encoded record batch, not per row."""

    def __init__(self, copy: CopyWriter) -> None:
        self.copy = copy
        self.bytes = 0

    def write(self, buffer: bytes | bytearray | memoryview) -> None:
        self.bytes += buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)
        self.copy.write(buffer)


def _cut_mid_copy(
    batches: Iterator[pa.RecordBatch], conn: Connection, task: TaskIdentity
) -> Iterator[pa.RecordBatch]:
    """The batches unchanged; the ``mid_copy`` fault point once the first is sent."""
    first = next(batches, None)
    if first is None:
        return
    yield first
    crash_point(
        "mid_copy",
        task.batch_id,
        task.partition_id,
        task.attempt_number,
        cut=terminator(conn.info.backend_pid),
    )
    yield from batches


def _numbered(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each batch with the ordinal column upsert needs (the last row of a key wins)."""
    offset = 0
    for batch in batches:
        ordinal = pa.array(np.arange(offset, offset + batch.num_rows, dtype=np.int64))
        offset += batch.num_rows
        yield batch.append_column(ORDINAL, ordinal)


class _Counter(Iterator[pa.RecordBatch]):
    """Counts the rows that pass, and the range and order of the key's first column among
    them (the key-order trap, core/key_ranges.py)."""

    def __init__(self, batches: Iterator[pa.RecordBatch], target: TargetPlan) -> None:
        self.batches = batches
        self.rows = 0
        self.sent = 0  # bytes the COPY sent (set by _load)
        self.column = target.key[0] if target.key else None
        self.low: Any = None
        self.high: Any = None
        self.keyed = 0
        self.descents = 0
        self.last: Any = None

    def __next__(self) -> pa.RecordBatch:
        batch = next(self.batches)
        self.rows += batch.num_rows
        if self.column is not None and batch.num_rows:
            self._observe(batch)
        return batch

    def _observe(self, batch: pa.RecordBatch) -> None:
        try:
            keys = batch.column(self.column).drop_null()
            if not len(keys):
                return
            found = pc.min_max(keys)
            low, high = found["min"].as_py(), found["max"].as_py()
            self.low = low if self.low is None else min(self.low, low)
            self.high = high if self.high is None else max(self.high, high)
            down = pc.sum(pc.less(keys[1:], keys[:-1])).as_py() if len(keys) > 1 else 0
            first = keys[0].as_py()
            self.descents += int(down or 0) + int(self.last is not None and first < self.last)
            self.last = keys[-1].as_py()
            self.keyed += len(keys)
        except (KeyError, TypeError, pa.ArrowException):  # not comparable: no range
            self.column = None

    def key_range(self) -> KeyRange | None:
        if self.column is None or self.low is None:
            return None
        return KeyRange(self.column, self.low, self.high, self.keyed, self.descents)


def _rollback_quietly(conn: Connection) -> None:
    if conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        conn.close()  # the server rolls back an open transaction of a closed session


def _write_error(
    exc: psycopg.Error, options: SinkOptions, target: TargetPlan, task: TaskIdentity
) -> SqlsinkError:
    diag = exc.diag
    message = scrub(diag.message_primary or str(exc), options.url, options.password)
    column = diag.column_name or _column_from_context(diag.context)
    parts = [f"{task.where()}: writing to table {target.table} failed"]
    line = _line_from_context(diag.context)
    if line is not None:  # COPY counts the partition's rows from 1, as sent
        parts.append(f"row {line} of the partition's COPY")
    if column:
        parts.append(f"column {column!r}")
    if diag.constraint_name:
        parts.append(f"constraint {diag.constraint_name!r}")
    parts.append(f"server says: {message}")
    if diag.message_detail:
        parts.append(scrub(diag.message_detail, options.url, options.password).rstrip("."))
    changed = _changed_types(diag.sqlstate, options, target)
    if changed:  # every attempt with this plan would fail so: terminal, and why
        text = "; ".join(parts) + f". Nothing of batch {task.batch_id} is visible. "
        return WriteError(
            text + f"{changed} (changed since by another query's schemaEvolution=widen, or "
            "an ALTER TABLE). Fix: restart the query (from its checkpoint): it plans again",
            batch=task.batch_id,
            partition=task.partition_id,
            column=column,
        )
    fix = _fix_for(diag.sqlstate, options, target, task)
    text = "; ".join(parts) + f". Nothing of batch {task.batch_id} is visible. {fix}"
    if isinstance(exc, psycopg.OperationalError) or diag.sqlstate in ("40001", "40P01", "55P03"):
        return TransientError(text, batch=task.batch_id, partition=task.partition_id)
    return WriteError(text, batch=task.batch_id, partition=task.partition_id, column=column)


def _changed_types(sqlstate: str | None, options: SinkOptions, target: TargetPlan) -> str:
    """The server could not read the binary COPY (08P01, 22P03): the planned columns
    whose type the table no longer has, said in one phrase ('' when none)."""
    if sqlstate not in ("08P01", "22P03"):
        return ""
    from sqlsink.postgres.catalog import table_columns

    try:
        with connect(options.url, options.password, application_name=appnames.ONE_OFF) as conn:
            now = {c.name: c for c in table_columns(conn, target.table)}
    except SqlsinkError:
        return ""
    changed = [
        f"column {c.name!r} of table {target.table} is {now[c.name].type_name} now, "
        f"{c.type_name} when the query planned"
        for c in target.columns
        if c.name in now and now[c.name].type_oid != c.type_oid
    ]
    return "; ".join(changed)


def _lock_fix(options: SinkOptions, target: TargetPlan, task: TaskIdentity) -> str:
    """Name who holds the locks we waited for: prepared transactions first (invariant 11)."""
    try:
        with connect(options.url, options.password, application_name=appnames.ONE_OFF) as conn:
            holders = relation_lock_holders(conn, [str(target.table)])
    except SqlsinkError:
        holders = []
    prepared = [h for h in holders if h.gid is not None]
    siblings = [h for h in prepared if _same_batch(h.gid, task)]
    leftovers = [h for h in prepared if h not in siblings]
    if leftovers:
        sinks = sorted({g.sink_id for h in leftovers if h.gid and (g := Gid.parse(h.gid))})
        recover = "; ".join(f"sqlsink recover --sink-id {s}" for s in sinks)
        return (
            f"Fix: {describe_holders(leftovers)} holds locks on the table's rows. "
            + (
                f"It is a sqlsink leftover: resolve it with {recover}"
                if sinks
                else "It is not sqlsink's: finish it with COMMIT PREPARED or ROLLBACK PREPARED"
            )
            + f", then restart the query (or raise lockTimeout, now {options.lock_timeout_s:.0f} s)"
        )
    if siblings:
        return (
            f"Fix: another partition of batch {task.batch_id} ({describe_holders(siblings)}) "
            "wrote the same key: partition the DataFrame by the table's key "
            "(repartition(n, key) or repartitionByRange(n, key)) so that each key is in one "
            "partition, or raise lockTimeout"
        )
    others = describe_holders(holders) if holders else "another transaction"
    return (
        f"Fix: {others} holds locks on the same rows; if it is a partition of the same batch "
        "(the same key in two partitions), partition the DataFrame by the table's key; or "
        "raise lockTimeout"
    )


def _same_batch(gid: str | None, task: TaskIdentity) -> bool:
    parsed = Gid.parse(gid) if gid else None
    return parsed is not None and (parsed.sink_id, parsed.run_id, parsed.batch_id) == (
        task.sink_id,
        task.run_id,
        task.batch_id,
    )


def _line_from_context(context: str | None) -> int | None:
    # e.g. 'COPY t_1, line 3, column amount: "abc"', 'COPY t_1, line 3'
    found = re.search(r"^COPY .*?, line (\d+)", context or "")
    return int(found.group(1)) if found else None


def _column_from_context(context: str | None) -> str | None:
    # e.g. 'COPY t_1, line 3, column amount: "abc"'
    if context and ", column " in context:
        return context.split(", column ", 1)[1].split(":", 1)[0]
    return None


def _fix_for(
    sqlstate: str | None, options: SinkOptions, target: TargetPlan, task: TaskIdentity
) -> str:
    if sqlstate == "55P03":
        return _lock_fix(options, target, task)
    if sqlstate == "53200":
        return (
            "Fix: the server ran out of prepared-transaction slots: each non-empty partition "
            "of a batch holds one until the batch commits, so max_prepared_transactions (a "
            "server setting, changed with a restart) must be at least the number of "
            "partitions of a batch, for all sinks of the server together. Raise it, or write "
            "fewer partitions (df.coalesce(n) before the sink); sqlsink check shows the setting"
        )
    if sqlstate and sqlstate.startswith("23"):
        return "Fix: correct or filter the offending rows, then restart the query"
    if sqlstate and sqlstate.startswith("22"):
        return "Fix: cast or clean the column's values in Spark, then restart the query"
    return "Fix the cause, then restart the query from its checkpoint"
