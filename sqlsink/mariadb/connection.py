"""One session of the MariaDB backend: a PyMySQL connection, and the two helpers every
statement of the backend goes through.

Why PyMySQL (issue 31, item 2): it is pure Python, so ``pip install`` works on a fresh
Debian executor without a compiler or libmariadb's headers (mysqlclient and MariaDB
Connector/Python build a C extension there); its LOAD DATA LOCAL reads a named file,
which may be a FIFO fed from memory (tests/mariadb/test_xa_facts.py), so a partition
streams without a temporary file of itself; its speed is the load's to measure (a later
slice: LOAD DATA against multi-row INSERT)."""

from __future__ import annotations

import socket
from typing import Any

from sqlsink.errors import SqlsinkError, TransientError

Connection = Any  # pymysql.connections.Connection: PyMySQL ships no types

LOG_DATABASE = "sqlsink"  # the commit log's database on the same server


def connect(
    url: str,
    *,
    database: str | None = None,
    password: str | None = None,
    doing: str | None = None,
    **kw: Any,
) -> Connection:
    """A session for ``mariadb://user:password@host:port/database`` (or ``mysql://``, a
    ``jdbc:`` prefix, ``user``/``password`` as query parameters; ``password`` given here
    wins over the URL's): autocommit, UTC, READ COMMITTED (the commit log's reads and
    deletes never wait on a prepared branch's rows they do not match).

    ``doing``: what the session is for (a partition's task, planning). Given, a failed
    login or connect is a TransientError in the sink's words (``not_connected``: the
    server, the user, why and the fix, never the password); without it PyMySQL's error
    passes, for the commands, whose ``driver_error`` explains it."""
    import pymysql

    from sqlsink.urlparts import mariadb_params

    params = mariadb_params(url)
    where: dict[str, Any] = {"host": params["host"] or "localhost", "port": params["port"] or 3306}
    if params.get("unix_socket"):
        where = {"unix_socket": params["unix_socket"]}
    secret = password if password is not None else (params["password"] or "")
    named = database if database is not None else params["dbname"]
    try:
        conn = pymysql.connect(
            user=params["user"] or "",
            # as bytes: PyMySQL sends a text password as latin1, but the server hashed the
            # user's UTF-8 text (tests/mariadb/test_connection.py)
            password=secret.encode(),
            database=named,
            autocommit=True,
            charset="utf8mb4",
            connect_timeout=kw.pop("connect_timeout", 10),
            init_command="SET time_zone = '+00:00'",
            **where,
            **kw,
        )
    except pymysql.err.MySQLError as exc:
        if doing is None:
            raise
        place = where.get("unix_socket") or f"{where['host']}:{where['port']}"
        product = "MySQL" if url.strip().removeprefix("jdbc:").startswith("mysql:") else "MariaDB"
        raise not_connected(
            exc, f"{product} at {place}", params["user"] or "", named, doing
        ) from None
    bound_waits(conn)
    execute(conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def not_connected(
    exc: BaseException, place: str, user: str, database: str | None, doing: str
) -> SqlsinkError:
    """PyMySQL's failed connect as the sink's TransientError: where (``place``: the
    server's product and address), as whom, why and the fix; the server's own words in
    brackets (they name no password)."""
    code = errno(exc)
    said = " ".join(str(getattr(exc, "args", ("",))[-1]).split())
    if code == 2003 and ("[Errno -2]" in said or "[Errno -3]" in said):
        code = 2005  # PyMySQL's "can't connect" for a name that does not resolve
    why, fix = _NOT_CONNECTED.get(code or 0, _OTHER)
    text = f"{why}. Fix: {fix}".format(user=user, database=database or "", place=place)
    return TransientError(f"{doing}: cannot connect to {place} as user {user!r}: {text} [{said}]")


_OTHER = (
    "the connection failed",
    "see the server's words in brackets; nothing was written through this connection",
)
_UNREACHABLE = (
    "nothing accepts connections there",
    "check that mariadbd runs, that the URL's host and port are its own, and that the "
    "executors may reach it (a firewall, a bind-address of 127.0.0.1)",
)
_NOT_CONNECTED: dict[int, tuple[str, str]] = {
    1045: (
        "the server refused the login of user {user!r} (a wrong password, or no account of "
        "that user for this client's host)",
        "check the URL's user and password (or the password option); CREATE USER "
        "{user!r}@'%' makes an account for any host",
    ),
    1044: (
        "user {user!r} may not use database {database!r} (or it does not exist)",
        "CREATE DATABASE {database}, or GRANT the user its rights on it "
        "(sqlsink check --url ... lists what the sink needs), or name another database "
        "in the URL",
    ),
    1049: (
        "database {database!r} does not exist",
        "CREATE DATABASE {database}, or name another database in the URL",
    ),
    1130: (
        "this host may not connect to the server as any user",
        "CREATE USER {user!r}@'<this host or %>' on the server",
    ),
    1040: (
        "the server has max_connections sessions already",
        "raise max_connections (each partition holds one session while it writes, the "
        "driver one more), or write fewer partitions at once",
    ),
    1203: (
        "user {user!r} has max_user_connections sessions already",
        "raise the user's MAX_USER_CONNECTIONS (each partition holds one session while it "
        "writes), or write fewer partitions at once",
    ),
    2002: _UNREACHABLE,
    2003: _UNREACHABLE,
    2005: (
        "the URL's host name does not resolve",
        "check the host of the URL (the executors resolve it too)",
    ),
    2013: (
        "the server ended the connection during the login",
        "check the server's log (max_connect_errors, a proxy in between)",
    ),
}


# Every wait on the network ends (docs/DESIGN.md invariant 11), as on PostgreSQL
# (postgres/connection.py's BOUNDED_WAITS): a half-open connection (a host gone without
# a FIN) is found by TCP keepalives within about a minute instead of the kernel's two
# hours, and data unacknowledged for a minute ends it. PyMySQL turns keepalives on with
# the kernel's timings; a read timeout is not set, since a legitimate statement (a
# partition's load, a GET_LOCK wait) may take longer than any fixed bound.
KEEPALIVE = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
USER_TIMEOUT_MS = 60_000


def bound_waits(conn: Connection) -> None:
    """Keepalive timings and TCP_USER_TIMEOUT on a TCP session (not a Unix socket)."""
    sock = getattr(conn, "_sock", None)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE.items():
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)


def rows(conn: Connection, statement: str, args: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(statement, args)
        return list(cur.fetchall())


def execute(conn: Connection, statement: str, args: Any = None) -> int:
    """Run a statement; the rows it changed."""
    with conn.cursor() as cur:
        return int(cur.execute(statement, args))


def errno(exc: BaseException) -> int | None:
    """The server's error number of a PyMySQL error (None for others)."""
    args = getattr(exc, "args", ())
    return int(args[0]) if args and isinstance(args[0], int) else None
