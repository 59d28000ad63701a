"""PostgreSQL's side of fault injection (``sqlsink/core/faults.py``): how a ``terminate``
fault ends a session, from a second connection as an operator or a failover would."""

from __future__ import annotations

from collections.abc import Callable

import psycopg


def terminator(pid: int | None) -> Callable[[str], None]:
    """``cut`` for ``crash_point``: ends the server process ``pid`` through ``url``."""

    def cut(url: str) -> None:
        if pid is None:
            raise RuntimeError("a terminate fault needs the caller's session pid")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))

    return cut
