"""Waits for a synchronous standby at commit time (docs/DESIGN.md invariant 11).

With ``synchronous_standby_names`` set (and ``synchronous_commit`` on, remote_write or
remote_apply), every transaction that wrote something waits at its end until a
standby confirms it: a PREPARE TRANSACTION, a COMMIT PREPARED, and each write to the
commit log that waits for its flush (a run's registration and a batch's figures do not:
docs/DESIGN.md 4.4). A standby that does not answer makes that wait endless. ``lock_timeout``
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
import time
import weakref
from collections.abc import Iterator
from typing import Any

import psycopg

from sqlsink.errors import CommitError
from sqlsink.postgres.connection import Connection

CANCELLED_WAIT = "canceling wait for synchronous replication"
SLACK_S = 1.0  # a lock wait (lock_timeout) ends before the watchdog does


_WATCHES: weakref.WeakKeyDictionary[Connection, Watch] = weakref.WeakKeyDictionary()


def watch(conn: Connection, lock_timeout_s: float) -> Watch:
    """The connection's Watch (one per connection, kept with it: a session kept between
    batches, ``sessions.py``, is watched by the same thread and notice handler)."""
    found = _WATCHES.get(conn)
    if found is None:
        found = _WATCHES[conn] = Watch(conn, lock_timeout_s)
    found.bound_s = lock_timeout_s + SLACK_S
    return found


class Watch:
    """Bounds the writes of one connection, and sees a cancelled wait for a standby.

    One watchdog thread per connection, started at its first bounded write and armed
    and disarmed per write (a thread per write cost about a millisecond each, 14 times a
    commit); it is a daemon and ends with the process or when the connection closes."""

    def __init__(self, conn: Connection, lock_timeout_s: float) -> None:
        self.conn = conn
        self.bound_s = lock_timeout_s + SLACK_S
        self.cancelled: str | None = None
        conn.add_notice_handler(self._notice)
        self._armed = threading.Condition()
        self._deadline: float | None = None  # of the write in progress, if any
        self._generation = 0  # which write the deadline is for
        self._fired_for = -1  # the generation the watchdog cancelled
        self._thread: threading.Thread | None = None

    def _notice(self, diag: Any) -> None:
        message = str(getattr(diag, "message_primary", "") or "")
        if message.startswith(CANCELLED_WAIT):
            self.cancelled = message

    def _watch(self) -> None:
        with self._armed:
            while not self.conn.closed:
                if self._deadline is None:
                    self._armed.wait(timeout=5.0)  # wakes to see the connection closed
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._armed.wait(timeout=left)
                    continue
                self._fired_for, self._deadline = self._generation, None
                with contextlib.suppress(Exception):
                    self.conn.cancel_safe(timeout=5)

    @contextlib.contextmanager
    def bounded(self, what: str, **context: Any) -> Iterator[None]:
        """Run a write of ``what``; cancel it after ``bound_s`` and raise ``CommitError``
        when it was cancelled (its transaction may be done here, unconfirmed)."""
        with self._armed:
            self._generation += 1
            generation = self._generation
            self._deadline = time.monotonic() + self.bound_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._watch, name="sqlsink write bound", daemon=True
                )
                self._thread.start()
            self._armed.notify()
        self.cancelled = None
        try:
            yield
        except psycopg.errors.QueryCanceled:
            if not self._disarm(generation):
                raise
            raise self._error(what, standby=False, **context) from None
        except BaseException:
            self._disarm(generation)
            raise
        fired = self._disarm(generation)
        if self.cancelled is not None or fired:
            raise self._error(what, standby=self.cancelled is not None, **context)

    def _disarm(self, generation: int) -> bool:
        """End the bound of this write; whether the watchdog cancelled it."""
        with self._armed:
            if self._generation == generation:
                self._deadline = None
            return self._fired_for == generation

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
