"""PyMySQL's errors as the sink's, at the MariaDB backend's boundary.

Every statement path of ``MariaDBBackend`` runs inside ``translated``: a lost session
(2002, 2003, 2006, 2013, 2055, PyMySQL's InterfaceError, or the AttributeError/OSError a
closed socket gives) becomes a TransientError naming the server (host:port, never the
password), what the sink was doing and what happens next; a lock wait timeout (1205)
names lockTimeout and who may hold the lock (the sink lock's holder, the sink's
prepared branches) and the fix; a deadlock (1213) is a TransientError too (the batch is
retried). Other errors pass unchanged: the sink's own, and the server's refusals (a
missing table, a privilege), which the CLI's ``driver_error`` explains."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlsink.errors import SqlsinkError, TransientError
from sqlsink.mariadb.connection import Connection, errno, rows

LOST = frozenset({2002, 2003, 2006, 2013, 2055})
LOCK_WAIT = 1205
DEADLOCK = 1213

RETRIED = (
    "The batch is retried (by Spark; a sqlsink command can simply be run again), and what "
    "the cut session left prepared is resolved from the commit log by the retry or the "
    "next run"
)


def server_of(conn: Connection) -> str:
    """host:port (or the Unix socket) of a PyMySQL session: never its password."""
    sock = getattr(conn, "unix_socket", None)
    if sock:
        return f"socket {sock}"
    return f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"


def is_lost(exc: BaseException, conn: Connection) -> bool:
    """Whether the session is gone (the server closed it, crashed, or cannot be reached)."""
    import pymysql

    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    if isinstance(exc, pymysql.err.OperationalError) and errno(exc) in LOST:
        return True
    # PyMySQL on a socket it has closed: 'NoneType' object has no attribute ..., or
    # the socket's own OSError (a reset, a broken pipe)
    return isinstance(exc, (AttributeError, OSError)) and not getattr(conn, "open", True)


@contextmanager
def translated(
    conn: Connection,
    doing: str,
    *,
    sink_id: str | None = None,
    user: str = "",
    db: str = "sqlsink",
    lock_timeout_s: float | None = None,
    after: str = RETRIED,
) -> Iterator[None]:
    """Run a backend step; PyMySQL's connection losses, lock wait timeouts and deadlocks
    leave it as TransientErrors that say ``doing`` ("committing batch 7's branches") and
    ``after`` (what happens next)."""
    try:
        yield
    except SqlsinkError:
        raise
    except Exception as exc:
        error = translate(exc, conn, doing, sink_id, user, db, lock_timeout_s, after)
        if error is None:
            raise
        raise error from exc


def translate(
    exc: BaseException,
    conn: Connection,
    doing: str,
    sink_id: str | None,
    user: str,
    db: str,
    lock_timeout_s: float | None,
    after: str,
) -> TransientError | None:
    where = server_of(conn)
    code = errno(exc)
    text = exc.args[1] if code is not None and len(exc.args) > 1 else str(exc)
    said = " ".join(str(text).split()) or type(exc).__name__
    said = f"error {code}: {said}" if code is not None else f"{type(exc).__name__}: {said}"
    sink = f"sink {sink_id}: " if sink_id else ""
    status = f"sqlsink status --url mariadb://{user or 'USER'}@{where}/DATABASE"
    if where.startswith("socket "):
        status = (
            f"sqlsink status --url 'mariadb://{user or 'USER'}@localhost/DATABASE?unix_socket=...'"
        )
    if is_lost(exc, conn):
        return TransientError(
            f"{sink}lost the connection to MariaDB at {where} while {doing} ({said}): the "
            f"server ended the sink's session (KILL CONNECTION, a restart or crash of "
            f"mariadbd, wait_timeout, the network). {after}. If it keeps failing, check that "
            f"the server is up and reachable at {where} and see `{status}`",
            sink_id=sink_id,
            server=where,
            errno=code,
        )
    if code == LOCK_WAIT:
        bound = "" if lock_timeout_s is None else f" {max(1, round(lock_timeout_s))} s"
        return TransientError(
            f"{sink}waited{bound} for a row lock of the commit log (`{db}`) at MariaDB "
            f"{where} while {doing}, in vain (1205, innodb_lock_wait_timeout, set from "
            f"lockTimeout): {holders(conn, sink_id)}. {after}. Fix: if a holder is stuck (a "
            "paused driver, a half-open session), end it (SHOW PROCESSLIST, KILL CONNECTION "
            f"id) and finish what it left prepared with `{status}` and sqlsink recover; "
            "or raise lockTimeout",
            sink_id=sink_id,
            server=where,
            errno=code,
        )
    if code == DEADLOCK:
        return TransientError(
            f"{sink}a deadlock at MariaDB {where} while {doing} (1213: InnoDB rolled this "
            f"transaction back to let another session go on; nothing of it was kept). "
            f"{after}",
            sink_id=sink_id,
            server=where,
            errno=code,
        )
    return None


def holders(conn: Connection, sink_id: str | None) -> str:
    """Who may hold the rows: the sink lock's holder (IS_USED_LOCK) and the sink's
    prepared branches (XA RECOVER); said as well as this session still can."""
    from sqlsink.mariadb import locks, xid

    parts = []
    try:
        holder = rows(conn, "SELECT IS_USED_LOCK(%s)", (locks.lock_name(sink_id),))[0][0]
        if holder is not None:
            parts.append(
                f"the sink lock ({locks.lock_name(sink_id)!r}) is held by connection {holder}"
            )
        branches = [xid.from_recover_row(r) for r in rows(conn, "XA RECOVER")]
        mine = sorted(
            str(g) for g in branches if g is not None and (sink_id is None or g.sink_id == sink_id)
        )
        if mine:
            shown = ", ".join(mine[:3]) + (" ..." if len(mine) > 3 else "")
            parts.append(
                f"{len(mine)} prepared branch(es) of the sink may hold rows ({shown}) "
                "until finished"
            )
    except Exception as exc:  # the session may be unusable now: say so, never fail here
        return f"who holds it could not be asked ({type(exc).__name__})"
    return (
        "; ".join(parts)
        if parts
        else (
            "no sink lock holder and no prepared branch of the sink now: another session's "
            "open transaction (SHOW PROCESSLIST; information_schema.INNODB_TRX)"
        )
    )
