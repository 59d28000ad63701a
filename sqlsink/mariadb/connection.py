"""One session of the MariaDB backend: a PyMySQL connection, and the two helpers every
statement of the backend goes through.

Why PyMySQL (issue 31, item 2): it is pure Python, so ``pip install`` works on a fresh
Debian executor without a compiler or libmariadb's headers (mysqlclient and MariaDB
Connector/Python build a C extension there); its LOAD DATA LOCAL reads a named file,
which may be a FIFO fed from memory (tests/mariadb/test_xa_facts.py), so a partition
streams without a temporary file of itself; its speed is the load's to measure (a later
slice: LOAD DATA against multi-row INSERT)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from typing import Any

from sqlsink.errors import SqlsinkError, TransientError

Connection = Any  # pymysql.connections.Connection: PyMySQL ships no types

LOG_DATABASE = "sqlsink"  # the commit log's database on the same server


CONNECT_TIMEOUT_S = 10  # the TCP connect, each read and write of the login, the login
# the whole login's bound is connect_timeout and this: a read that stalls is given up by
# its own read timeout first (the server "did not answer"), the watchdog ends a login
# that answers, too slowly (the server "did not finish the login")
LOGIN_MARGIN_S = 1.0


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

    The login is bounded (invariant 11): ``connect_timeout`` (10 s) bounds the TCP
    connect, and each read and write of the login (the server's greeting, the
    authentication, the session's settings) as a read and write timeout, as libmariadb's
    connect_timeout bounds the greeting; a server that accepts and never answers is given
    up after it. The whole login (the TCP connect, the greeting, the authentication,
    init_command and the settings below) ends within ``connect_timeout`` +
    ``LOGIN_MARGIN_S``: a watchdog (``_Watchdog``) shuts the login's socket down then, so
    a server that trickles its greeting a byte at a time (each read within the bound) is
    given up too. The session itself then has no read or write timeout
    (``_end_login_timeouts``): a partition's load and a GET_LOCK wait may legitimately
    take longer than any fixed bound; ``bound_waits`` finds a vanished host instead.

    ``doing``: what the session is for (a partition's task, planning, the driver's
    commit; "" for a command, whose name the CLI says). Given, a failed login or connect
    is a TransientError in the sink's words (``not_connected``: the server, the user, why
    and the fix, never the password); without it PyMySQL's error passes (the sink's own
    second sessions, whose callers say what failed)."""
    import pymysql

    from sqlsink.urlparts import mariadb_params

    params = mariadb_params(url)
    where: dict[str, Any] = {"host": params["host"] or "localhost", "port": params["port"] or 3306}
    if params.get("unix_socket"):
        where = {"unix_socket": params["unix_socket"]}
    secret = password if password is not None else (params["password"] or "")
    named = database if database is not None else params["dbname"]
    timeout = kw.pop("connect_timeout", CONNECT_TIMEOUT_S)
    conn = None
    watchdog = None
    try:
        # defer_connect: the login on a socket of connect's own, which the watchdog ends
        conn = pymysql.connect(
            user=params["user"] or "",
            # as bytes: PyMySQL sends a text password as latin1, but the server hashed the
            # user's UTF-8 text (tests/mariadb/test_connection.py)
            password=secret.encode(),
            database=named,
            autocommit=True,
            charset="utf8mb4",
            connect_timeout=timeout,
            # PyMySQL's connect_timeout bounds the TCP connect only: these bound the
            # login's reads (the greeting first) and writes, until _end_login_timeouts
            read_timeout=timeout,
            write_timeout=timeout,
            init_command="SET time_zone = '+00:00'",
            defer_connect=True,
            **where,
            **kw,
        )
        deadline = time.monotonic() + timeout + LOGIN_MARGIN_S
        sock = _login_socket(conn)
        watchdog = _Watchdog(sock, deadline - time.monotonic())
        conn.connect(sock)
        bound_waits(conn)
        execute(conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        _end_login_timeouts(conn)
        if watchdog.stop():
            # it fired after the last read of the login: the socket is shut down
            raise pymysql.err.OperationalError(2013, _unfinished(timeout))
    except BaseException as exc:
        cut = watchdog is not None and watchdog.stop()
        if conn is not None:
            with contextlib.suppress(Exception):  # its socket may be closed already
                conn.close()
        if cut and isinstance(exc, (pymysql.err.MySQLError, OSError)):
            # the watchdog's shutdown, not the server, ended the read or write
            if doing is None:
                raise pymysql.err.OperationalError(2013, _unfinished(timeout)) from exc
            exc = pymysql.err.OperationalError(2013, _unfinished(timeout))
        if doing is None or not isinstance(exc, pymysql.err.MySQLError):
            raise
        place = where.get("unix_socket") or f"{where['host']}:{where['port']}"
        product = "MySQL" if is_mysql_url(url) else "MariaDB"
        raise not_connected(
            exc,
            f"{product} at {place}",
            params["user"] or "",
            named,
            doing,
            socket_path=where.get("unix_socket"),
            timeout_s=timeout,
            unfinished=cut,
        ) from None
    return conn


def _unfinished(timeout: float) -> str:
    """PyMySQL's words for a login the watchdog ended (in not_connected's brackets)."""
    ended = timeout + LOGIN_MARGIN_S
    return f"Login not finished within {timeout:g} s (ended by sqlsink after {ended:g} s)"


def _login_socket(conn: Connection) -> socket.socket:
    """The connected socket ``Connection.connect(sock)`` logs in on, made as PyMySQL
    makes its own (``Connection.connect``: a Unix socket, or TCP with connect_timeout,
    TCP_NODELAY and keepalives; ``host_info`` and ``_secure`` set as it sets them) and
    its failure raised as PyMySQL raises it (OperationalError 2003 naming the OSError,
    which ``not_connected`` reads). TLS, should a caller pass ``ssl``, is unchanged:
    PyMySQL wraps the given socket in ``_request_authentication``."""
    import pymysql

    try:
        if conn.unix_socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(conn.connect_timeout)
                sock.connect(conn.unix_socket)
            except BaseException:
                sock.close()
                raise
            conn.host_info = "Localhost via UNIX socket"
            conn._secure = True
            return sock
        extra: dict[str, Any] = {}
        if conn.bind_address is not None:
            extra["source_address"] = (conn.bind_address, 0)
        sock = socket.create_connection((conn.host, conn.port), conn.connect_timeout, **extra)
        conn.host_info = f"socket {conn.host}:{conn.port}"
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return sock
    except OSError as e:
        exc = pymysql.err.OperationalError(
            2003, f"Can't connect to MySQL server on {conn.host!r} ({e})"
        )
        exc.original_exception = e
        raise exc from e


class _Watchdog:
    """Shuts the login's socket down (both ways) after ``seconds``: the login's read or
    write in progress ends at once (PyMySQL's 'Lost connection'), whichever socket
    PyMySQL reads by then (a TLS-wrapped one too: the shutdown is of the connection,
    through a duplicate of the descriptor). ``stop`` cancels it and says whether it
    fired."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._watch = sock.dup()
        self._lock = threading.Lock()
        self._fired = False
        self._stopped = False
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._fired = True
            with contextlib.suppress(OSError):
                self._watch.shutdown(socket.SHUT_RDWR)

    def stop(self) -> bool:
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._timer.cancel()
                self._watch.close()
            return self._fired


def is_mysql_url(url: str) -> bool:
    """Whether the URL names MySQL (``mysql://``, ``jdbc:mysql:``) rather than MariaDB."""
    return url.strip().removeprefix("jdbc:").startswith("mysql:")


def _end_login_timeouts(conn: Connection) -> None:
    """The session without the login's read and write timeouts: its statements may wait
    as long as they must (a load, GET_LOCK within its own bound).

    PyMySQL has no public way to change them after connect: it keeps them in
    ``_read_timeout`` and ``_write_timeout`` and sets the socket's timeout from them
    before each read and write (``Connection._read_packet``, ``_write_bytes``). This is
    the one place the sink writes them; should PyMySQL rename them, the check below fails
    every connect loudly rather than leave a 10 s bound on every statement
    (tests/mariadb/test_connection_attack3.py pins both)."""
    for name in ("_read_timeout", "_write_timeout"):
        if not hasattr(conn, name):
            raise RuntimeError(
                f"PyMySQL's Connection has no {name} (a PyMySQL this sqlsink does not know): "
                "the login's timeout cannot be taken off the session"
            )
        setattr(conn, name, None)


def quote_name(name: str) -> str:
    """An identifier in backticks (a backtick in it doubled)."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """A string literal (a quote or backslash in it doubled or escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def not_connected(
    exc: BaseException,
    place: str,
    user: str,
    database: str | None,
    doing: str,
    *,
    socket_path: str | None = None,
    timeout_s: float = CONNECT_TIMEOUT_S,
    unfinished: bool = False,
) -> SqlsinkError:
    """PyMySQL's failed connect as the sink's TransientError: where (``place``: the
    server's product and address), as whom, why and the fix; the server's own words in
    brackets (they name no password). ``unfinished``: connect's watchdog ended a login
    that went on past its bound."""
    code = errno(exc)
    said = " ".join(str(getattr(exc, "args", ("",))[-1]).split())
    timed_out = _timed_out(exc)
    why, fix = _UNFINISHED if unfinished else _reason(code, said, timed_out, socket_path)
    product = place.split(" at ", 1)[0]
    text = f"{why}. Fix: {fix}".format(
        user=user,
        database=database or "",
        place=place,
        seconds=f"{timeout_s:g}",
        daemon="mysqld" if product == "MySQL" else "mariadbd",
        product=product,
        account=f"{sql_string(user)}@'%'",
        quoted_database=quote_name(database or ""),
        user_literal=sql_string(user),
    )
    prefix = f"{doing}: " if doing else ""
    return TransientError(f"{prefix}cannot connect to {place} as user {user!r}: {text} [{said}]")


def _timed_out(exc: BaseException) -> bool:
    """Whether a socket timeout ended the connect: PyMySQL raises its error while
    handling the socket's (``__context__``), or names it '(timed out)'."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        if isinstance(seen, TimeoutError):
            return True
        seen = getattr(seen, "original_exception", None) or seen.__context__
    return "(timed out)" in " ".join(str(a) for a in getattr(exc, "args", ()))


def _reason(
    code: int | None, said: str, timed_out: bool, socket_path: str | None
) -> tuple[str, str]:
    if code == 2013 and timed_out:
        return _MUTE
    if code == 2003 and socket_path is not None:
        if "[Errno 13]" in said:
            return _SOCKET_DENIED
        if "[Errno 2]" in said:
            return _NO_SOCKET
        return _SOCKET_UNREACHABLE
    if code == 2003 and timed_out:
        return _NO_ANSWER
    if code == 2003 and ("[Errno -2]" in said or "[Errno -3]" in said):
        code = 2005  # PyMySQL's "can't connect" for a name that does not resolve
    if code == 1226:
        return _limit_reached(said)
    return _NOT_CONNECTED.get(code or 0, _OTHER)


_OTHER = (
    "the connection failed",
    "see the server's words in brackets; nothing was written through this connection",
)
_UNREACHABLE = (
    "nothing accepts connections there",
    "check that {daemon} runs, that the URL's host and port are its own, and that this "
    "machine (for the sink: every executor) may reach it (a firewall, a bind-address of "
    "127.0.0.1)",
)
_NO_ANSWER = (
    "nothing answered the connection within {seconds} s (a host that is down, or a "
    "firewall that drops the packets)",
    "check the URL's host and port, that the host is up, and that no firewall drops "
    "connections from this machine (for the sink: from every executor)",
)
_MUTE = (
    "the server accepted the connection but did not answer the login within {seconds} s",
    "check that {daemon} at that address is alive and not hung or overloaded (a paused "
    "process, a full disk, every thread busy: SHOW PROCESSLIST from another session), and "
    "that the URL's host and port are the server's own and not a proxy or load balancer "
    "whose server is gone",
)
_UNFINISHED = (
    "the server accepted the connection but did not finish the login within {seconds} s "
    "(it answered, too slowly)",
    _MUTE[1],
)
_NO_SOCKET = (
    "no socket at that path",
    "check that {daemon} runs on this host and that the URL's unix_socket is the path "
    "of its socket setting (SELECT @@socket on the server, or its configuration file)",
)
_SOCKET_UNREACHABLE = (
    "nothing accepts connections on that socket",
    "check that {daemon} runs on this host (a socket file outlives a stopped server) and "
    "that the URL's unix_socket is the path of its socket setting (SELECT @@socket on "
    "the server)",
)
_SOCKET_DENIED = (
    "this process may not open that socket",
    "let this process's user open the socket (its directory's and file's permissions), "
    "or connect over TCP (the URL's host and port instead of unix_socket)",
)
# ER_USER_LIMIT_REACHED (1226): an account's own limits, named by the server's message
# ("User 'x' has exceeded the 'max_user_connections' resource (current value: 1)");
# MySQL names two of them max_questions and max_updates
_PER_HOUR = (
    "; the server counts it per hour: FLUSH USER_RESOURCES resets the counts now (as a "
    "user with RELOAD)"
)
_LIMITS: dict[str, tuple[str, str]] = {
    "max_user_connections": (
        "MAX_USER_CONNECTIONS",
        "raise it: ALTER USER {account} WITH MAX_USER_CONNECTIONS <more> (0: the server's "
        "max_user_connections; the account's own host if not '%'); each partition holds one "
        "session while it writes, the driver one more; or write fewer partitions at once",
    ),
    "max_connections_per_hour": (
        "MAX_CONNECTIONS_PER_HOUR",
        "raise it: ALTER USER {account} WITH MAX_CONNECTIONS_PER_HOUR <more> (0: no "
        "limit; the account's own host if not '%'); each batch opens two sessions per "
        "partition and the driver's" + _PER_HOUR,
    ),
    "max_queries_per_hour": (
        "MAX_QUERIES_PER_HOUR",
        "raise it: ALTER USER {account} WITH MAX_QUERIES_PER_HOUR <more> (0: no limit; "
        "the account's own host if not '%'); every statement of the sink counts" + _PER_HOUR,
    ),
    "max_updates_per_hour": (
        "MAX_UPDATES_PER_HOUR",
        "raise it: ALTER USER {account} WITH MAX_UPDATES_PER_HOUR <more> (0: no limit; "
        "the account's own host if not '%'); every statement of the sink that writes "
        "counts" + _PER_HOUR,
    ),
}
_LIMITS["max_questions"] = _LIMITS["max_queries_per_hour"]
_LIMITS["max_updates"] = _LIMITS["max_updates_per_hour"]
_LIMIT_NAMED = re.compile(r"exceeded the '(\w+)' resource")


def _limit_reached(said: str) -> tuple[str, str]:
    found = _LIMIT_NAMED.search(said)
    resource = found.group(1) if found else None
    if resource is None or resource.lower() not in _LIMITS:
        return (
            "user {user!r} has used up a resource limit of its account (error 1226)",
            "see the resource the server names in brackets; ALTER USER {account} WITH "
            "<that limit> <more, or 0> raises it (the account's own host if not '%')",
        )
    clause, fix = _LIMITS[resource.lower()]
    return (
        f"user {{user!r}} has reached its account's {resource} limit (error 1226, the "
        f"account's {clause})",
        fix,
    )


_NOT_CONNECTED: dict[int, tuple[str, str]] = {
    1045: (
        "the server refused the login of user {user!r} (a wrong password, or no account of "
        "that user for this client's host)",
        "check the URL's user and password (or the password option); CREATE USER "
        "{account} makes an account for any host",
    ),
    1044: (
        "user {user!r} may not use database {database!r} (or it does not exist)",
        "CREATE DATABASE {quoted_database}, or GRANT ALL ON {quoted_database}.* TO "
        "{account} (the account's own host if not '%'; sqlsink check --url ... lists what "
        "the sink needs), or name another database in the URL",
    ),
    1049: (
        "database {database!r} does not exist",
        "CREATE DATABASE {quoted_database}, or name another database in the URL",
    ),
    1130: (
        "this host may not connect to the server as any user",
        "CREATE USER {user_literal}@'<this host, or %>' on the server",
    ),
    1040: (
        "the server has max_connections sessions already",
        "raise max_connections (each partition holds one session while it writes, the "
        "driver one more), or write fewer partitions at once",
    ),
    1203: (
        "user {user!r} has max_user_connections sessions already",
        "raise the server's max_user_connections (each partition holds one session while "
        "it writes, the driver one more), or write fewer partitions at once",
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
