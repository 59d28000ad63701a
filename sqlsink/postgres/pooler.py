"""Connection poolers between the sink and PostgreSQL: found, and refused in transaction mode.

Each connection of the sink must keep one server session for its whole life: the sink
lock is a session advisory lock, and ``sqlsink status``/``recover`` tell live runs by
their sessions. PgBouncer in session mode keeps that; in transaction (or statement)
mode it hands each transaction to whichever server session is free. PgBouncer does not
tell its clients its mode (no parameter status; ``SHOW`` only on its admin console), so:

1. **Behind a pooler?** (every connection: one round trip, ~0.1 ms) PgBouncer gives
   clients a cancel key of its own, so the pid libpq got at login (``BackendKeyData``)
   is not ``pg_backend_pid()``; directly, or through a TCP proxy, they are equal.
2. **Does the server session stay?** (behind a pooler: once per target and process
   every ``VERDICT_TTL_S``) The connection LISTENs on a new channel, a second
   connection NOTIFYs it, and the first waits without sending anything. In session
   mode its server session is linked to it throughout, so the notification arrives at
   once. In transaction mode that session went back to the pool after the LISTEN: the
   notification goes to the second connection (handed that same session: PgBouncer's
   LIFO reuse on a quiet pool), to a third client using it, or nowhere (PgBouncer
   drops it: "got packet 'A' from server when not linked"), never to the waiting one,
   however quiet or busy the pool. After ``NOTIFY_WAIT_S`` a last query gives a slow
   server session a final chance (in session mode it must deliver before answering).

Residual risks: (a) a transaction-pooled session that could not run for
``NOTIFY_WAIT_S`` (a starved machine) and is then handed back to this very connection
for the last query passes as session pooling; (b) no verdict, so a warning and the next
connection probes again, when the second connection gets no server session within
``SERVER_WAIT_S`` (a session pool no bigger than its clients), cannot connect, or LISTEN
is refused (a standby); (c) a pooler that passes the server's pid as its cancel key yet
pools by transaction is not probed (PgBouncer never does); (d) tested with PgBouncer 1.18
only: another pooler that drops notifications in session mode would be refused; (e) a
pool switched to transaction mode under a running process is seen within
``VERDICT_TTL_S``. A refused pool keeps the probe's LISTEN on one of its server sessions
(an unused channel) until PgBouncer closes that session.

Measured on loopback (2 cores): step 2 through a session pool ~1.1 ms (a client login
and three round trips; ~2.5 ms more when PgBouncer must open a server session for it);
a transaction pool is refused in ~2.6 ms, or ~1 s when the notifier was handed another
server session.
"""

from __future__ import annotations

import logging
import select
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sqlsink.errors import ConfigError

log = logging.getLogger("sqlsink")

NOTIFY_WAIT_S = 1.0  # a session pool passes the notification on in well under a millisecond
SERVER_WAIT_S = 2.0  # for the second connection to be given a server session
VERDICT_TTL_S = 300.0  # a session pool's verdict is reused this long (per target, per process)
PROBE_APPLICATION_NAME = "sqlsink pooler check"

_verdicts: dict[tuple[str, ...], float] = {}  # target -> monotonic time of its session verdict
_verdicts_lock = threading.Lock()


def pooled_kwargs() -> dict[str, Any]:
    """psycopg ``connect()`` arguments the sink needs behind a pooler.

    psycopg prepares a statement on the server once it has run 5 times on a connection;
    PgBouncer before 1.21 does not track prepared statements, so they leak to the next
    client of a server session when ``server_reset_query`` is empty (or in transaction
    mode: "prepared statement "_pg3_0" already exists"). The sink repeats few
    statements per connection, so it never needs them (measured: none reaches the
    threshold in a batch).
    """
    return {"prepare_threshold": None}


@dataclass(frozen=True)
class Verdict:
    """What the probe found: ``mode`` is 'direct', 'session', 'transaction' or 'unknown'."""

    mode: str
    evidence: str
    cached: bool = False


def backend_pid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def behind_pooler(conn: psycopg.Connection[Any]) -> tuple[bool, int]:
    """(whether a pooler answers in PostgreSQL's place, the server pid): one round trip."""
    pid = backend_pid(conn)
    return pid != conn.info.backend_pid, pid


def check(conn: psycopg.Connection[Any], conninfo: str, *, shown_url: str) -> Verdict:
    """Probe a new autocommit connection; ConfigError if a pooler shares its server session.

    ``conninfo`` opens a second connection to the same target (the probe's notifier);
    ``shown_url`` names the target in messages (no password).
    """
    pooled, pid = behind_pooler(conn)
    if not pooled:
        return Verdict("direct", "the server's pid is the one given at login")
    key = _target(conn)
    with _verdicts_lock:
        since = _verdicts.get(key)
    if since is not None and time.monotonic() - since < VERDICT_TTL_S:
        return Verdict("session", "probed before (cached)", cached=True)
    verdict = probe(conn, _same_server(conn, conninfo), pid)
    if verdict.mode == "transaction":
        raise transaction_pooling_error(shown_url, verdict.evidence)
    if verdict.mode == "session":
        with _verdicts_lock:
            _verdicts[key] = time.monotonic()
    else:
        log.warning(
            "sqlsink: %s goes through a connection pooler whose pooling mode could not be "
            "checked (%s); the sink needs session pooling (PgBouncer pool_mode = session)",
            shown_url,
            verdict.evidence,
        )
    return verdict


def forget_verdicts() -> None:
    """Probe every target again (tests; a pooler reconfigured under a running process)."""
    with _verdicts_lock:
        _verdicts.clear()


def probe(conn: psycopg.Connection[Any], conninfo: str, pid: int) -> Verdict:
    """Whether the server session ``pid`` stays with ``conn`` (see the module's step 2)."""
    channel = f"sqlsink_pooler_{uuid.uuid4().hex}"
    try:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:  # a hot standby refuses LISTEN, say: no verdict
        return Verdict("unknown", f"LISTEN failed ({exc.sqlstate or type(exc).__name__})")
    try:
        try:
            other = _notify_from_another_client(conninfo, channel)
        except psycopg.Error as exc:  # the pooler's client limit, say: no verdict
            what = exc.sqlstate or type(exc).__name__
            return Verdict("unknown", f"the check's second connection failed ({what})")
        if other is None:
            if backend_pid(conn) != pid:
                return Verdict("transaction", "two statements ran in two server sessions")
            return Verdict(
                "unknown",
                f"a second connection got no server session within {SERVER_WAIT_S:g} s",
            )
        other_pid, other_notified = other
        if other_pid == pid or other_notified:
            return Verdict(
                "transaction",
                "a second client was given this connection's server session while it was "
                "still connected",
            )
        if _notified(conn, channel, NOTIFY_WAIT_S):
            return Verdict("session", "the server session stayed with the connection")
        # a slow server session gets a last chance: in session mode the notification
        # is sent at the latest before this query's answer
        if backend_pid(conn) == pid and _notified(conn, channel, 0.0):
            return Verdict("session", "the server session stayed with the connection (slow)")
        return Verdict(
            "transaction",
            "the connection's server session went back to the pool between two statements",
        )
    finally:
        conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))


def transaction_pooling_error(shown_url: str, evidence: str) -> ConfigError:
    return ConfigError(
        f"{shown_url} goes through a connection pooler in transaction pooling mode "
        f"(PgBouncer transaction pooling detected: {evidence}; statement pooling is "
        "refused too). sqlsink cannot work through it: a pooler in this mode hands each "
        "transaction to whichever server session is free, so the sink's session advisory "
        "lock (one committer or recovery per sink at a time) excludes nobody and may be "
        "released on another session or leaked, and the sink's runs can no longer be "
        "told by their sessions (sqlsink status and recover judge whether a run is alive "
        "by them). Point the url at PostgreSQL directly, or at a PgBouncer database "
        "entry with pool_mode = session (for example, in [databases]: "
        "'mydb_sqlsink = host=... dbname=mydb pool_mode=session')",
        url=shown_url,
        evidence=evidence,
    )


def _same_server(conn: psycopg.Connection[Any], conninfo: str) -> str:
    """``conninfo`` for the host and port ``conn`` reached (a URL may list several)."""
    params = dict(conninfo_to_dict(conninfo))
    params.update(host=conn.info.host, port=str(conn.info.port))
    params.pop("hostaddr", None)
    if conn.info.hostaddr:
        params["hostaddr"] = conn.info.hostaddr
    return make_conninfo("", **params)


def _target(conn: psycopg.Connection[Any]) -> tuple[str, ...]:
    info = conn.info
    return (info.host, str(info.port), info.dbname, info.user)


def _notified(conn: psycopg.Connection[Any], channel: str, timeout_s: float) -> bool:
    """Whether ``conn`` receives a notification on ``channel`` within ``timeout_s``,
    sending nothing meanwhile (psycopg's backlog of notifications counts too)."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        for notify in conn.notifies(timeout=remaining, stop_after=1):
            if notify.channel == channel:
                return True
        if time.monotonic() >= deadline:
            return False


def _notify_from_another_client(conninfo: str, channel: str) -> tuple[int, bool] | None:
    """NOTIFY ``channel`` from a new connection: (its server pid, whether it got the
    notification itself); None when it got no server session within ``SERVER_WAIT_S``."""
    other = psycopg.connect(
        conninfo, autocommit=True, application_name=PROBE_APPLICATION_NAME, **pooled_kwargs()
    )
    try:
        pgconn = other.pgconn
        # libpq's own calls: the wait for a server session in the pooler's queue is
        # bounded here (psycopg's execute would wait for as long as the pooler does)
        pgconn.send_query_params(b"SELECT pg_backend_pid(), pg_notify($1, '')", [channel.encode()])
        deadline = time.monotonic() + SERVER_WAIT_S
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([pgconn.socket], [], [], remaining)[0]:
                return None
        pid: int | None = None
        error = ""
        while (result := pgconn.get_result()) is not None:
            if result.status == psycopg.pq.ExecStatus.TUPLES_OK and result.ntuples == 1:
                value = result.get_value(0, 0)
                pid = int(value) if value is not None else None
            elif result.status == psycopg.pq.ExecStatus.FATAL_ERROR:
                error = (result.error_message or b"").decode(errors="replace").strip()
        if pid is None:
            raise psycopg.OperationalError(f"the pooler check's NOTIFY failed: {error}")
        notified = False
        while (notify := pgconn.notifies()) is not None:
            notified = notified or notify.relname.decode() == channel
        return pid, notified
    finally:
        other.close()  # also takes a waiting connection out of the pooler's queue
