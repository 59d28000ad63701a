"""Waits for a synchronous standby at commit time (docs/DESIGN.md invariant 11).

With ``synchronous_standby_names`` set (and ``synchronous_commit`` on, remote_write or
remote_apply), every transaction that wrote something waits at its end until a
standby confirms it: a PREPARE TRANSACTION, a COMMIT PREPARED, and each write to the
commit log. A standby that does not answer makes that wait endless. ``lock_timeout``
does not apply; ``statement_timeout`` does not either, except for COMMIT/ROLLBACK
PREPARED (PostgreSQL disarms it before a statement's own commit, where the wait of a
plain write or of PREPARE TRANSACTION happens). Only a cancel ends the wait, with a
WARNING ("canceling wait for synchronous replication ...") and the transaction
already done on this server.

So the sink bounds each of its writes on the client: ``Watch.bounded`` cancels the
statement (``cancel_safe``) when it has not returned within ``lockTimeout`` plus a
second, and then raises an error that names the standby setting and says what is and
is not done.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg

from sqlsink.errors import CommitError
from sqlsink.postgres.connection import Connection

CANCELLED_WAIT = "canceling wait for synchronous replication"
SLACK_S = 1.0  # a lock wait (lock_timeout) ends before the watchdog does


class Watch:
    """Bounds the writes of one connection, and sees a cancelled wait for a standby."""

    def __init__(self, conn: Connection, lock_timeout_s: float) -> None:
        self.conn = conn
        self.bound_s = lock_timeout_s + SLACK_S
        self.cancelled: str | None = None
        conn.add_notice_handler(self._notice)

    def _notice(self, diag: Any) -> None:
        message = str(getattr(diag, "message_primary", "") or "")
        if message.startswith(CANCELLED_WAIT):
            self.cancelled = message

    @contextlib.contextmanager
    def bounded(self, what: str, **context: Any) -> Iterator[None]:
        """Run a write of ``what``; cancel it after ``bound_s`` and raise ``CommitError``
        when it was cancelled (its transaction may be done here, unconfirmed)."""
        fired = threading.Event()

        def fire() -> None:
            fired.set()
            with contextlib.suppress(Exception):
                self.conn.cancel_safe(timeout=5)

        timer = threading.Timer(self.bound_s, fire)
        timer.daemon = True
        self.cancelled = None
        timer.start()
        try:
            yield
        except psycopg.errors.QueryCanceled:
            if not fired.is_set():
                raise
            raise self._error(what, standby=False, **context) from None
        finally:
            timer.cancel()
            timer.join()
        if self.cancelled is not None or fired.is_set():
            raise self._error(what, standby=self.cancelled is not None, **context)

    def _error(self, what: str, *, standby: bool, **context: Any) -> CommitError:
        self.cancelled = None
        names = _standby_names(self.conn)
        if not standby:
            return CommitError(
                f"{what} did not finish within {self.bound_s:g} s (the sink's lockTimeout "
                f"plus a second) and was cancelled"
                + (
                    f" (synchronous_standby_names = '{names}': was it waiting for a standby? "
                    "SELECT application_name, state, sync_state FROM pg_stat_replication)"
                    if names
                    else ""
                ),
                **context,
            )
        return CommitError(
            f"{what} waited {self.bound_s:g} s (the sink's lockTimeout plus a second) for a "
            f"synchronous standby (synchronous_standby_names = '{names}') and was cancelled: "
            "it is committed on this server, but no standby confirmed it. Check the standby "
            "(SELECT application_name, state, sync_state FROM pg_stat_replication), or change "
            "synchronous_standby_names; until a standby confirms, a failover can lose it (the "
            "sink then stops with a data-loss error naming the batches)",
            **context,
        )


def _standby_names(conn: Connection) -> str:
    try:
        row = conn.execute("SELECT current_setting('synchronous_standby_names')").fetchone()
    except psycopg.Error:  # the session is gone or in a failed transaction
        return "?"
    return "" if row is None else str(row[0])
