"""One session of the MariaDB backend: a PyMySQL connection, and the two helpers every
statement of the backend goes through.

Why PyMySQL (issue 31, item 2): it is pure Python, so ``pip install`` works on a fresh
Debian executor without a compiler or libmariadb's headers (mysqlclient and MariaDB
Connector/Python build a C extension there); its LOAD DATA LOCAL reads a named file,
which may be a FIFO fed from memory (tests/mariadb/test_xa_facts.py), so a partition
streams without a temporary file of itself; its speed is the load's to measure (a later
slice: LOAD DATA against multi-row INSERT)."""

from __future__ import annotations

from typing import Any

Connection = Any  # pymysql.connections.Connection: PyMySQL ships no types

LOG_DATABASE = "sqlsink"  # the commit log's database on the same server


def connect(
    url: str, *, database: str | None = None, password: str | None = None, **kw: Any
) -> Connection:
    """A session for ``mariadb://user:password@host:port/database`` (or ``mysql://``, a
    ``jdbc:`` prefix, ``user``/``password`` as query parameters; ``password`` given here
    wins over the URL's): autocommit, UTC, READ COMMITTED (the commit log's reads and
    deletes never wait on a prepared branch's rows they do not match)."""
    import pymysql

    from sqlsink.urlparts import mariadb_params

    params = mariadb_params(url)
    where: dict[str, Any] = {"host": params["host"] or "localhost", "port": params["port"] or 3306}
    if params.get("unix_socket"):
        where = {"unix_socket": params["unix_socket"]}
    conn = pymysql.connect(
        user=params["user"] or "",
        password=password if password is not None else (params["password"] or ""),
        database=database if database is not None else params["dbname"],
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=kw.pop("connect_timeout", 10),
        init_command="SET time_zone = '+00:00'",
        **where,
        **kw,
    )
    execute(conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


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
