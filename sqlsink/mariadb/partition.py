"""One partition's XA branch on MariaDB, on an executor (postgres/partition.py's role).

exactly_once: connect; the participant's checks before the write (replay, binding,
leftovers: ``sqlsink.core.participant``); the session says whose it is
(``enter_task_session``); ``XA START``; the rows by ``LOAD DATA LOCAL INFILE`` from a
FIFO that a thread feeds batch by batch (no file of the partition: ``encoding.py`` makes
the text); any warning of the load is an error; the marker row in the same branch;
``XA END``; ``XA PREPARE``; DISCONNECT (MariaDB lets another session finish a branch
only once the session that prepared it has ended: tests/mariadb/test_xa_facts.py);
then the participant's check after PREPARE on a new session. On any error before the
branch is prepared: ``XA END`` and ``XA ROLLBACK`` of our own branch, and the session is
closed (the server rolls back the branch of a session that ends before PREPARE).

Why LOAD DATA and not multi-row INSERT: measured by benchmarks/mariadb_load.py (numbers
in benchmarks/results/mariadb_load.md). Its trap: with LOCAL, the server cannot stop
the client's file half-way, so it turns what strict mode makes errors (NULL into NOT
NULL, a value out of range, a duplicate key) into warnings and goes on, as if IGNORE
were given (MariaDB's LOAD DATA INFILE documentation). So the load's warnings are read
after it, and one is enough to roll the branch back with the server's own words.

mode=upsert: before XA START the session creates its temporary staging table; the load
goes to it with REPLACE (the last row of a key wins), then the branch deletes the keys
whose last row is flagged deleted and inserts the rest ON DUPLICATE KEY UPDATE
(``upsert.py``). The session's end after XA PREPARE drops the staging table.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from sqlsink.core.committer import DEFAULT_RUN_TIMEOUT_S
from sqlsink.core.faults import crash_point
from sqlsink.core.gid import Gid
from sqlsink.core.model import PartitionOutcome, TaskIdentity
from sqlsink.core.participant import Participant, task_gid
from sqlsink.core.resolver import TimeoutPolicy
from sqlsink.errors import SqlsinkError, TransientError, WriteError
from sqlsink.mariadb import commit_log, encoding, xid
from sqlsink.mariadb.backend import MariaDBBackend, enter_task_session
from sqlsink.mariadb.connection import LOG_DATABASE, Connection, connect, errno, execute, rows
from sqlsink.mariadb.upsert import COLLISION, UpsertPlan, collision_message

FEED_END_S = 10.0  # how long the FIFO's feeder may take to end once the load is over
# errors a retry may not meet again: lost connection, lock wait timeout, deadlock, and
# the branch rolled back by the server for one of those
_TRANSIENT = {1205, 1213, 1614, 1402, 2006, 2013}
# the load session's: strict (a bad value is an error, not a changed value), a 0 written
# to an AUTO_INCREMENT column is 0 (not the next id: upsert's key 0 would insert a new
# row each batch), and none of the modes that change how its statements read
# (ANSI_QUOTES, NO_BACKSLASH_ESCAPES)
SQL_MODE = (
    "STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO"
)
# LOAD DATA LOCAL refused: local_infile off on the server (MariaDB's 4166, MySQL's 1148)
_NO_LOCAL_INFILE = {1148, 3948, 4166}
# a value the column refuses (NULL into NOT NULL, out of range, too long, not a value of
# its type): upsert's INSERT ... SELECT from its staging table raises them as errors
_BAD_VALUE = {1048, 1263, 1264, 1265, 1292, 1366, 1406}
_COLUMN = re.compile(r"column '([^']+)'", re.IGNORECASE)


@dataclass(frozen=True)
class LoadTarget:
    """Where a partition's rows go: the table (``name`` or ``database.name``, in the URL's
    database when unqualified) and the bounds of the task's waits. The Arrow batches'
    field names are the table's column names."""

    url: str
    table: str
    lock_timeout_s: float = 60.0
    timeouts: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S
    log_database: str = LOG_DATABASE
    upsert: UpsertPlan | None = None  # mode=upsert: the key and the delete flag

    def quoted(self) -> str:
        return ".".join(encoding.quote_name(p) for p in self.table.split(".", 1))

    def database(self, conn: Connection) -> str:
        """The table's database: its own qualifier, else the session's."""
        if "." in self.table:
            return self.table.split(".", 1)[0]
        return str(rows(conn, "SELECT DATABASE()")[0][0])


def write_partition(
    target: LoadTarget, task: TaskIdentity, batches: Iterable[pa.RecordBatch]
) -> PartitionOutcome:
    """Load the partition's rows into a prepared branch; what the committer needs to know."""
    given = iter(batches)
    first = next((b for b in given if b.num_rows), None)
    started = time.time()
    if first is None:  # nothing to write: no branch, no gid
        return PartitionOutcome.of_task(task, None, 0, skipped=False, started=started)
    conn = connect(target.url, local_infile=True, doing=task.where())
    try:
        execute(conn, f"SET SESSION sql_mode = '{SQL_MODE}'")
        _refuse_statement_logging(conn, target, task)
        backend = MariaDBBackend(conn, target.lock_timeout_s, target.log_database)
        participant = Participant(backend, task, target.timeouts, target.run_timeout_s)
        start = participant.before_write()
        if start.skip or start.adopt:
            counted = first.num_rows + sum(b.num_rows for b in given)  # Spark wants it read
            if start.skip:
                return PartitionOutcome.of_task(task, None, 0, skipped=True, started=started)
            return PartitionOutcome.of_task(
                task, start.adopt, counted, skipped=False, started=started
            )
        enter_task_session(conn, task.sink_id, task.batch_id, task.partition_id, backend.db)
        gid = task_gid(task)
        count = _branch(conn, target, task, gid, _chain(first, given))
    finally:
        conn.close()  # after XA PREPARE: the branch is detached, and can be finished
    crash_point("after_prepare", task.batch_id, task.partition_id, task.attempt_number)
    after = connect(target.url, doing=f"{task.where()}, after XA PREPARE")
    try:
        backend = MariaDBBackend(after, target.lock_timeout_s, target.log_database)
        Participant(backend, task, target.timeouts, target.run_timeout_s).after_prepare(gid)
    finally:
        after.close()
    return PartitionOutcome.of_task(task, str(gid), count, skipped=False, started=started)


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


def _branch(
    conn: Connection,
    target: LoadTarget,
    task: TaskIdentity,
    gid: Gid,
    batches: Iterator[pa.RecordBatch],
) -> int:
    """XA START, the load, the marker, XA END, XA PREPARE: the rows loaded. On an error
    before PREPARE the branch is rolled back (a WriteError or TransientError says where)."""
    branch = xid.encode(gid).sql()
    prepared = False
    try:
        upsert = target.upsert
        if upsert is None:
            execute(conn, f"XA START {branch}")
            count = _load(conn, target, task, batches, target.quoted())
        else:
            first = next(batches)
            columns = first.schema.names
            database = target.database(conn)
            for statement in upsert.create_stage(target.quoted(), database, columns):
                execute(conn, statement)  # before XA START: DDL would end the branch
            execute(conn, f"XA START {branch}")
            stage = upsert.stage(database)
            count = _load(conn, target, task, _chain(first, batches), stage, replace=True)
            for statement in upsert.apply(target.quoted(), database, columns):
                try:
                    execute(conn, statement)
                except Exception as exc:
                    if errno(exc) != COLLISION:
                        raise
                    raise WriteError(
                        f"{task.where()}: {collision_message(target.table, upsert.keys)}",
                        batch=task.batch_id,
                        partition=task.partition_id,
                    ) from exc
        commit_log.insert_marker(
            conn, target.log_database, str(gid), task.sink_id, task.batch_id,
            task.partition_id, count,
        )  # fmt: skip
        execute(conn, f"XA END {branch}")
        prepared = True  # from here, a failure may leave it prepared: an orphan the sweeps end
        execute(conn, f"XA PREPARE {branch}")
        return count
    except SqlsinkError:
        if not prepared:
            _rollback_quietly(conn, branch)
        raise
    except Exception as exc:
        if not prepared:
            _rollback_quietly(conn, branch)
        raise _write_error(exc, target, task, lost=not conn.open) from None


def _load(
    conn: Connection,
    target: LoadTarget,
    task: TaskIdentity,
    batches: Iterator[pa.RecordBatch],
    table: str,
    *,
    replace: bool = False,
) -> int:
    """LOAD DATA LOCAL INFILE into ``table`` (quoted) from a FIFO fed by a thread; the
    rows loaded (``replace``: the rows read, replaced ones too). A warning of the load,
    or a value the encoding refuses, is a WriteError naming the column."""
    place = tempfile.mkdtemp(prefix="sqlsink-load-")
    fifo = os.path.join(place, "rows")
    os.mkfifo(fifo, 0o600)
    feeder = _Feeder(fifo, batches, task, _cut(conn))
    columns: list[str] = []
    try:
        first = next(batches)
        columns = first.schema.names
        feeder.start(first)
        statement, args = encoding.load_statement(table, columns, fifo, replace=replace)
        with conn.cursor() as cur:
            loaded = int(cur.execute(statement, args))
            warned = int(cur.warning_count)
            if replace:  # its count is rows added + rows replaced: the server's info says
                loaded = _records(cur, loaded)
        feeder.finish()
        if warned:
            raise _warning_error(conn, target, task, warned)
        if loaded != feeder.rows:
            raise WriteError(
                f"{task.where()}: LOAD DATA into table {target.table} took {loaded} of "
                f"{feeder.rows} rows. Nothing of batch {task.batch_id} is visible",
                batch=task.batch_id,
                partition=task.partition_id,
            )
        return loaded
    finally:
        feeder.finish()
        shutil.rmtree(place, ignore_errors=True)


def _records(cur: object, affected: int) -> int:
    """The rows LOAD DATA read (``Records: N  Deleted: D  Skipped: S ...``); the rows
    it changed when the server's info is missing."""
    result = getattr(cur, "_result", None)
    info = getattr(result, "message", None)
    text = info.decode() if isinstance(info, bytes) else str(info or "")
    found = re.search(r"Records:\s*(\d+).*?Skipped:\s*(\d+)", text)
    if found is None:
        return affected
    return int(found.group(1)) - int(found.group(2))


class _Feeder:
    """Writes the batches' text into the FIFO from a thread, while PyMySQL reads the other
    end and sends it; counts the rows; keeps the error that stopped it."""

    def __init__(
        self,
        fifo: str,
        batches: Iterator[pa.RecordBatch],
        task: TaskIdentity,
        cut: Callable[[str], None],
    ) -> None:
        self.fifo = fifo
        self.batches = batches
        self.task = task
        self.cut = cut
        self.rows = 0
        self.stop = False  # set when the load is over: the feeder writes no more
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self, first: pa.RecordBatch) -> None:
        self.thread = threading.Thread(target=self._run, args=(first,), daemon=True)
        self.thread.start()

    def _run(self, first: pa.RecordBatch) -> None:
        try:
            with open(self.fifo, "wb") as pipe:
                self._write(pipe, first)
                task = self.task
                crash_point(
                    "mid_copy", task.batch_id, task.partition_id, task.attempt_number, cut=self.cut
                )
                for batch in self.batches:
                    if self.stop:
                        break
                    self._write(pipe, batch)
        except BaseException as exc:  # given to the loading thread
            self.error = exc

    def _write(self, pipe: object, batch: pa.RecordBatch) -> None:
        data = encoding.encode(batch)
        pipe.write(data)  # type: ignore[attr-defined]
        self.rows += batch.num_rows

    def finish(self) -> None:
        """Wait for the thread (bounded). A feeder the load left behind (the server
        refused the statement before reading, or PyMySQL stopped reading) is told to
        stop, and a reader of our own drains the FIFO until it has: it is never left
        blocked. Raises the feeder's error, said where."""
        thread, self.thread = self.thread, None
        if thread is None:
            return
        self.stop = True
        thread.join(0.05)
        deadline = time.monotonic() + FEED_END_S
        fd: int | None = None
        try:
            while thread.is_alive() and time.monotonic() < deadline:
                try:
                    if fd is None:
                        fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
                    while os.read(fd, 1 << 20):
                        pass
                except BlockingIOError:
                    pass
                except OSError:
                    fd = None
                thread.join(0.02)
        finally:
            if fd is not None:
                os.close(fd)
        error = self.error
        if isinstance(error, WriteError):
            task = self.task
            raise WriteError(
                f"{task.where()}: {error}. Nothing of batch {task.batch_id} is visible, and "
                "nothing of it is left prepared",
                **{**error.context, "batch": task.batch_id, "partition": task.partition_id},
            ) from None
        if error is not None and not isinstance(error, BrokenPipeError):
            raise error


def _cut(conn: Connection) -> Callable[[str], None]:
    """``cut`` for the ``mid_copy`` fault: ends this session from another one."""
    me = int(rows(conn, "SELECT CONNECTION_ID()")[0][0])

    def cut(url: str) -> None:
        other = connect(url)
        try:
            execute(other, f"KILL CONNECTION {me}")
        finally:
            other.close()

    return cut


def _warning_error(
    conn: Connection, target: LoadTarget, task: TaskIdentity, count: int
) -> WriteError:
    """The load's first warnings, as the error that rolls the branch back."""
    found = rows(conn, "SHOW WARNINGS LIMIT 3")
    said = "; ".join(str(r[2]) for r in found) or f"{count} warning(s)"
    named = _COLUMN.search(said)
    column = named.group(1) if named else None
    where = f", column {column!r}" if column else ""
    return WriteError(
        f"{task.where()}: writing to table {target.table} failed{where}: server says: "
        f"{said} ({count} warning(s) in all; LOAD DATA LOCAL makes strict mode's errors "
        f"warnings, and sqlsink refuses every one). Nothing of batch {task.batch_id} is "
        "visible, and nothing of it is left prepared. Fix: correct or filter the offending "
        "rows (or the column's type), then restart the query",
        batch=task.batch_id,
        partition=task.partition_id,
        column=column,
    )


def _write_error(
    exc: Exception, target: LoadTarget, task: TaskIdentity, *, lost: bool = False
) -> Exception:
    """A server's error, said where, transient or not; the connection ``lost`` under
    another error (PyMySQL's own, of its closed socket: the server ended the session in
    the load, as net_read_timeout does) a TransientError; any other error as it is."""
    if not type(exc).__module__.startswith("pymysql"):
        return _lost_error(exc, target, task) if lost else exc
    code = errno(exc)
    message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    named = _COLUMN.search(message)
    column = named.group(1) if named else None
    where = f", column {column!r}" if column else ""
    text = (
        f"{task.where()}: writing to table {target.table} failed{where}: server says: "
        f"{message}. Nothing of batch {task.batch_id} is visible"
    )
    if code in _NO_LOCAL_INFILE:
        return WriteError(
            f"{text}. Fix: the load needs LOAD DATA LOCAL INFILE, which this server refuses: "
            "set local_infile = ON (SET GLOBAL local_infile = 1, and local_infile=1 in the "
            "server's configuration); sqlsink check shows the setting",
            batch=task.batch_id,
            partition=task.partition_id,
        )
    if code in _TRANSIENT or code is None:
        advice = ""
        if code == 1205 and target.upsert is not None:
            advice = (
                " (Fix, if it recurs: a key in two partitions of one batch makes the second "
                "wait on the first's prepared branch: partition the DataFrame by the key, "
                "repartition(n, key), as the foreachBatch writer does)"
            )
        return TransientError(
            f"{text}; the batch is retried{advice}",
            batch=task.batch_id,
            partition=task.partition_id,
        )
    fix = (
        "Fix: correct or filter the offending rows (or the column's type), then restart the query"
        if code in _BAD_VALUE
        else "Fix the cause (the table, its columns, the sink role's privileges), then "
        "restart the query from its checkpoint"
    )
    return WriteError(
        f"{text}. {fix}",
        batch=task.batch_id,
        partition=task.partition_id,
        column=column,
    )


def _refuse_statement_logging(conn: Connection, target: LoadTarget, task: TaskIdentity) -> None:
    """binlog_format = STATEMENT set since planning: the session's first write (the run's
    registration) would get 1665; refused before, in the sink's words."""
    log_bin, value = rows(conn, "SELECT @@log_bin, @@SESSION.binlog_format")[0]
    if log_bin and str(value).upper() == "STATEMENT":
        from sqlsink.mariadb.backend import statement_logging

        raise WriteError(
            f"{task.where()}: writing to table {target.table} refused: "
            f"{statement_logging(str(value))}. Nothing of batch {task.batch_id} was written, "
            "nothing is left prepared; restart the query once the setting is fixed",
            batch=task.batch_id,
            partition=task.partition_id,
        )


def _lost_error(exc: Exception, target: LoadTarget, task: TaskIdentity) -> TransientError:
    """The server ended the load's session: most often net_read_timeout, the longest it
    waits for the next piece of LOAD DATA LOCAL while Spark's iterator pauses."""
    try:
        conn = connect(target.url)
        try:
            value = f"{rows(conn, 'SELECT @@GLOBAL.net_read_timeout')[0][0]} s"
        finally:
            conn.close()
    except Exception:  # the server is gone: the value is unknown
        value = "unknown"
    return TransientError(
        f"{task.where()}: writing to table {target.table} failed: the server ended the "
        f"connection during the load ({type(exc).__name__}: {exc}). Most likely Spark's "
        "iterator paused between two batches of rows longer than the server's "
        f"net_read_timeout = {value}, the longest it waits for the next piece of LOAD DATA "
        f"LOCAL. Nothing of batch {task.batch_id} is visible; the batch is retried. Fix, if "
        "it recurs: raise it, SET GLOBAL net_read_timeout = 600 (and net_read_timeout=600 "
        "under [mariadbd] in the server's configuration); sqlsink check judges the setting",
        batch=task.batch_id,
        partition=task.partition_id,
    )


def _rollback_quietly(conn: Connection, branch: str) -> None:
    """Our own branch, before PREPARE: ended and rolled back, or left to the server's
    rollback of a session that ends (the caller closes it)."""
    for statement in (f"XA END {branch}", f"XA ROLLBACK {branch}"):
        try:
            execute(conn, statement)
        except Exception:  # not started, rolled back already, or cut
            continue
