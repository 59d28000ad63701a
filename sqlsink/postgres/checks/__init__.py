"""Server settings the sink depends on: read them, judge them, say how to fix them.

Three layers, so that the rules are testable without a server:

``read_settings(conn)``
    The effective values for the connection's login role and database, each with
    where it comes from (``pg_settings.source``, cross-checked with
    ``pg_db_role_setting``).
``analyse(settings, trigger_interval_s=..., partitions=..., slowest_write_s=...)``
    Pure: one ``Finding`` per setting checked (level "error", "warning" or "ok"),
    each naming the value, its source, the quantity it was compared with, and the
    exact statement that fixes it, at the level the value comes from.
``check_server(conn, ...)``
    Both. ``sqlsink check`` prints the findings; the sink calls
    ``check_at_start`` when it plans a batch, which logs them through
    ``log_findings`` (once, then again only when the verdict changes) and raises
    ``ConfigError`` on an error, and ``check_after_commit`` after a commit whose
    partition count or slowest write grew past what the process measured before;
    both judge with the process's measures (``measured``), so they agree.

The rules (DESIGN.md section 5)
-------------------------------
``max_prepared_transactions``
    0: error (every PREPARE TRANSACTION fails; needs a restart to change). Fewer
    than the partitions of a batch: error (a batch can never prepare all of its
    partitions). Fewer than 2 x partitions: warning (retried and speculative
    attempts, and other users of the cluster-wide slots, need headroom). Only
    with ``exactly_once`` (the default); the other semantics never prepare. The "ok"
    finding (what ``sqlsink check`` shows on a good server) says that each
    non-empty partition takes a connection and a slot, and how to cap them
    (option ``maxPartitions``, ``df.coalesce``); "too few slots" names the option.
``statement_timeout``, ``idle_in_transaction_session_timeout``, ``transaction_timeout`` (17+)
    Each can end a partition's transaction before it prepares (the COPY is one
    statement streaming all of a partition's rows; none of them applies once
    prepared). A non-zero value below the required time is a warning. Required:
    the longer of the trigger interval and ``safety_factor`` x the slowest
    partition write, when either is known; else ``FLOOR_S`` (10 min). (Verified on
    PostgreSQL 16: idle_in_transaction_session_timeout does not fire while a COPY
    streams, only between statements, so for it the rule is on the safe side.)
``lock_timeout``
    Replaced on every session of the sink's tasks and commit (``PostgresBackend`` sets
    ``lock_timeout`` from the option lockTimeout when it opens on a session, also a kept
    one after its ``DISCARD ALL``) and in every wait for the sink's advisory lock
    (``locks.acquire_sink_lock`` sets its own bound, also in the CLI). It applies only to
    the planner's session (``plan_write``, before any data): its CREATE TABLE (option
    createTable) waits at most this long for locks on the target's schema or for
    another session creating the same table (the migrations of the commit log set
    their own, ``MIGRATION_LOCK_TIMEOUT_S``; its other statements read the catalog),
    and to the commit-log statements of a one-off load's cleanup and of the CLI
    other than ``recover``, which can wait only behind a migration's lock.
    "ok" when off or at least ``LOCK_WAIT_FLOOR_S``; below it a warning naming that
    wait.
``idle_session_timeout``
    Closes a connection idle longer than it: shorter than the trigger interval
    (below ``FLOOR_S`` when the interval is unknown) is a warning, for a
    connection kept between batches.

Sources are those of the session that reads them: run the check connected as the
sink's role to the sink's database (its URL). Role settings (``ALTER ROLE``) are
those of the login role (``session_user``): PostgreSQL applies them at login and
``SET ROLE`` does not change them.

The modules
-----------
``model`` (levels, ``Finding``, ``Setting``, ``ServerSettings``), ``reading``
(``read_settings``), ``idents`` (role and database names as SQL: the server's quoting,
a pure fallback), ``fixes`` (``describe_source``, ``fix_statement``), ``durations``,
``rules`` (``analyse``) and ``at_start`` (``check_server``, ``check_at_start``,
``require_prepared_transactions``, ``log_findings``). Import from this package.
"""

from __future__ import annotations

from sqlsink.core.admin import Finding
from sqlsink.postgres.checks.at_start import (
    Measured,
    Verdict,
    VerdictState,
    check_after_commit,
    check_at_start,
    check_server,
    log_findings,
    max_prepared_transactions,
    measured,
    require_prepared_transactions,
    server_address,
    verdict,
)
from sqlsink.postgres.checks.durations import (
    format_seconds,
    recommended,
)
from sqlsink.postgres.checks.fixes import (
    describe_source,
    fix_statement,
    role_fix,
)
from sqlsink.postgres.checks.idents import (
    database_sql,
    quote_ident,
    role_sql,
)
from sqlsink.postgres.checks.model import (
    DEFAULT_SAFETY_FACTOR,
    ERROR,
    FLOOR_S,
    LOCK_WAIT_FLOOR_S,
    MIN_PREPARED_SLOTS,
    OK,
    SETTINGS,
    SINK_LOCK_TIMEOUT_DEFAULT,
    SYNC_REP,
    TIMEOUTS,
    WARNING,
    ServerSettings,
    Setting,
)
from sqlsink.postgres.checks.reading import (
    read_settings,
)
from sqlsink.postgres.checks.rules import (
    PER_PARTITION,
    analyse,
    prepared_slots_needed,
)

__all__ = [
    "DEFAULT_SAFETY_FACTOR",
    "ERROR",
    "FLOOR_S",
    "LOCK_WAIT_FLOOR_S",
    "MIN_PREPARED_SLOTS",
    "OK",
    "PER_PARTITION",
    "SETTINGS",
    "SINK_LOCK_TIMEOUT_DEFAULT",
    "SYNC_REP",
    "TIMEOUTS",
    "WARNING",
    "Finding",
    "Measured",
    "ServerSettings",
    "Setting",
    "Verdict",
    "VerdictState",
    "analyse",
    "check_after_commit",
    "check_at_start",
    "check_server",
    "database_sql",
    "describe_source",
    "fix_statement",
    "format_seconds",
    "log_findings",
    "max_prepared_transactions",
    "measured",
    "prepared_slots_needed",
    "quote_ident",
    "read_settings",
    "recommended",
    "require_prepared_transactions",
    "role_fix",
    "role_sql",
    "server_address",
    "verdict",
]
