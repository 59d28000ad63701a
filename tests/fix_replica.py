"""A real PostgreSQL primary with a real streaming-replication standby, for failover tests.

Not a plugin: a test opens ``replicated_pair(tmp_path)`` itself. Both servers are
``EmbeddedPostgres`` clusters (used as they are, from the outside); the standby is a
``pg_basebackup -R`` copy of the primary, asynchronous (no synchronous_standby_names).

Promotion ends a replay pause and first replays all the WAL the standby has already
received: pausing replay does not make a promoted standby lack anything. To lose
transactions the way an asynchronous failover does, cut the stream first
(``detach_standby``), write on the primary, then ``stop_primary`` and ``promote``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psycopg

from sqlsink.embedded import EmbeddedPostgres

T = TypeVar("T")

PAIR_SETTINGS: dict[str, str | int] = {
    "wal_level": "replica",
    "max_wal_senders": 4,
    "max_prepared_transactions": 64,  # a standby needs at least the primary's
    "fsync": "off",
}
REPLICATION_HBA = "host replication all 127.0.0.1/32 trust\n"
DEFAULT_TIMEOUT_S = 30.0
_POLL_S = 0.05


def _query(url: str, query: str, params: tuple[object, ...] = ()) -> tuple[object, ...]:
    """The one row of a query, in autocommit."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(query, params).fetchone()
    if row is None:
        raise AssertionError(f"no row from {query!r}")
    return row


def _wait_for(what: str, probe: Callable[[], tuple[bool, T]], timeout_s: float) -> T:
    """Poll ``probe`` (done, observed) until done; a TimeoutError naming ``what`` and
    the last observation after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, observed = probe()
        if done:
            return observed
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s (last seen: {observed!r})")
        time.sleep(_POLL_S)


@dataclass
class ReplicaPair:
    primary: EmbeddedPostgres
    standby: EmbeddedPostgres

    def primary_url(self, db: str = "postgres") -> str:
        return self.primary.url(db)

    def standby_url(self, db: str = "postgres") -> str:
        return self.standby.url(db)

    # -- replication ------------------------------------------------------------------

    def wait_caught_up(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        """Wait until the standby has replayed everything the primary had written when
        called; that LSN. Times out while replay is paused or the stream is cut."""
        (target,) = _query(self.primary_url(), "SELECT pg_current_wal_lsn()::text")

        def probe() -> tuple[bool, tuple[object, ...]]:
            row = _query(
                self.standby_url(),
                "SELECT coalesce(pg_last_wal_replay_lsn() >= %s::pg_lsn, false),"
                " pg_last_wal_replay_lsn()::text, pg_get_wal_replay_pause_state()",
                (target,),
            )
            return bool(row[0]), row[1:]

        _wait_for(f"standby replay up to the primary's LSN {target}", probe, timeout_s)
        return str(target)

    def pause_replay(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Pause replay and wait until the startup process has actually paused. WAL is
        still received (and a promotion replays it: see the module's doc)."""
        _query(self.standby_url(), "SELECT pg_wal_replay_pause()")
        self._wait_pause_state("paused", timeout_s)

    def resume_replay(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        _query(self.standby_url(), "SELECT pg_wal_replay_resume()")
        self._wait_pause_state("not paused", timeout_s)

    def replay_paused(self) -> bool:
        (paused,) = _query(self.standby_url(), "SELECT pg_is_wal_replay_paused()")
        return bool(paused)

    def _wait_pause_state(self, state: str, timeout_s: float) -> None:
        def probe() -> tuple[bool, object]:
            (now,) = _query(self.standby_url(), "SELECT pg_get_wal_replay_pause_state()")
            return now == state, now

        _wait_for(f"standby replay pause state {state!r}", probe, timeout_s)

    def streaming(self) -> bool:
        """True while the standby's WAL receiver is streaming from the primary."""
        (n,) = _query(
            self.standby_url(),
            "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'",
        )
        return bool(n)

    def detach_standby(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Cut the stream, as a network partition does: the standby forgets
        primary_conninfo (ALTER SYSTEM + reload) and its WAL receiver stops. What the
        primary commits from now on never reaches the standby."""
        url = self.standby_url()
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")

        def receiver_gone() -> tuple[bool, object]:
            (n,) = _query(url, "SELECT count(*) FROM pg_stat_wal_receiver")
            return n == 0, f"{n} WAL receiver(s)"

        def sender_gone() -> tuple[bool, object]:
            (n,) = _query(self.primary_url(), "SELECT count(*) FROM pg_stat_replication")
            return n == 0, f"{n} WAL sender(s)"

        _wait_for("the standby's WAL receiver to stop", receiver_gone, timeout_s)
        _wait_for("the primary's WAL sender to go", sender_gone, timeout_s)

    # -- failover ---------------------------------------------------------------------

    def promote(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Promote the standby and wait until it accepts writes. Ends a replay pause
        and replays all WAL received so far."""
        seconds = max(1, int(timeout_s))
        (done,) = _query(
            self.standby_url(), "SELECT pg_promote(wait => true, wait_seconds => %s)", (seconds,)
        )
        if not done:
            raise TimeoutError(f"standby promotion: not within {seconds} s")

        def probe() -> tuple[bool, object]:
            (recovering,) = _query(self.standby_url(), "SELECT pg_is_in_recovery()")
            return not recovering, f"pg_is_in_recovery() = {recovering}"

        _wait_for("the promoted standby to leave recovery", probe, timeout_s)

    def stop_primary(self, mode: str = "immediate") -> None:
        """Stop the primary: 'immediate' is a crash; 'fast' first sends a connected
        standby all WAL up to the shutdown checkpoint."""
        self.primary.stop(mode)
        if self.primary.is_running():
            raise RuntimeError(f"the primary is still running after 'pg_ctl stop -m {mode}'")


def _prepare_dir(server: EmbeddedPostgres) -> None:
    """The standby's base directory, reachable and owned by the server's user (what
    EmbeddedPostgres.init() does before initdb, which it skips for an existing copy)."""
    server.base_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(server.base_dir, 0o755)
    if server.user:
        shutil.chown(server.base_dir, server.user)


def _base_backup(primary: EmbeddedPostgres, standby: EmbeddedPostgres, timeout_s: float) -> None:
    tool = primary.bindir / "pg_basebackup"
    if not tool.is_file():
        raise FileNotFoundError(f"no pg_basebackup in {primary.bindir}: cannot make a standby")
    args = [
        str(tool),
        *("-D", str(standby.data_dir)),
        *("-d", f"host=127.0.0.1 port={primary.port} user=postgres"),
        *("-X", "stream", "-c", "fast", "-R", "--no-sync"),
    ]
    try:
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            user=standby.user,
            cwd=standby.base_dir,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"pg_basebackup: not within {timeout_s:g} s") from exc
    if done.returncode != 0:
        raise RuntimeError(f"pg_basebackup failed (exit {done.returncode}): {done.stderr[-2000:]}")


@contextlib.contextmanager
def replicated_pair(
    base: Path,
    settings: Mapping[str, str | int] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Iterator[ReplicaPair]:
    """A running primary and an asynchronous, streaming, caught-up hot standby, both
    destroyed (servers and directories) on exit. ``settings`` apply to both servers
    (a standby needs max_connections, max_prepared_transactions... >= the primary's)."""
    merged = {**PAIR_SETTINGS, **(settings or {})}
    primary = EmbeddedPostgres(Path(base) / "primary", settings=merged)
    standby: EmbeddedPostgres | None = None
    try:
        primary.init()
        with open(primary.data_dir / "pg_hba.conf", "a", encoding="utf-8") as hba:
            hba.write(REPLICATION_HBA)
        primary.start()
        # made after the primary listens, so its free port cannot be the primary's
        standby = EmbeddedPostgres(Path(base) / "standby", settings=merged)
        _prepare_dir(standby)
        _base_backup(primary, standby, timeout_s)
        # The copy's postgresql.conf carries the primary's port and socket directory;
        # lines appended later win (postgresql.auto.conf holds only primary_conninfo).
        standby.configure(standby.settings)
        standby.start()  # init() sees PG_VERSION and skips initdb
        pair = ReplicaPair(primary, standby)
        _wait_for(
            "the standby to stream from the primary", lambda: (pair.streaming(), None), timeout_s
        )
        pair.wait_caught_up(timeout_s)
        yield pair
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()
