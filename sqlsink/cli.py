"""``sqlsink``: the on-call tool of the sink: recover, status, check.

    sqlsink recover --url URL [--sink-id ID] [--checkpoint DIR] [--dry-run] [--force] [--json]
    sqlsink status  --url URL [--sink-id ID] [--max-age 5min] [--batches 5] [--json]
    sqlsink check   --url URL [--trigger-interval DURATION] [--json]

``--url`` defaults to the environment variable ``SQLSINK_URL``. Prefer a password in
``PGPASSWORD`` or ``~/.pgpass`` to one in the URL (the command line is visible to
other users); either way no password ever appears in the output.

``recover`` resolves prepared transactions with the sink's own committer
(``sqlsink.core.committer.Committer`` on ``PostgresBackend``): the same rule, under
the same lock. It refuses to act on a sink that is live (see ``--help``).

Exit codes (every command)
--------------------------
0  nothing wrong; everything resolved
1  warnings, or something left to do (a dry run with actions, a sink refused as live)
2  usage, connection, permission or configuration error (nothing, or not all, was done)
3  data loss: a decided transaction is neither prepared nor committed

JSON output (``--json``): one object on stdout, ``"version": 1``
-----------------------------------------------------------------
Every command::

    {"version": 1, "command": "recover" | "status" | "check",
     "url": "<the URL, password replaced by ***>", "database": str | null,
     "role": str | null, "superuser": bool | null,
     "warnings": [{"level": "info" | "warning" | "error", "sink_id": str | null,
                   "message": str, "fix": str | null}],
     "error": null | {"message": str, "fix": str | null},
     "exit_code": int}

When ``error`` is set (exit 2 before anything could be reported) the
command-specific keys below may be missing.

``recover`` adds::

    "dry_run": bool, "forced": bool,
    "sinks": [{"sink_id": str, "bound_query_id": str | null,
               "live": bool, "lock": "free" | "held",
               "lock_holders": [SESSION], "sessions": [SESSION],
               "status": "nothing to do" | "planned" | "recovered" | "refused"
                         | "failed" | "data loss",
               "message": str | null,
               "committed": int, "rolled_back": int, "already_committed": int,
               "completed_batches": [int]}],
    "actions": [{"gid": str, "sink_id": str | null, "batch_id": int | null,
                 "partition_id": int | null, "run_id": str | null,
                 "database": str, "owner": str, "prepared_at": ISO-8601,
                 "age_seconds": float, "action": "commit" | "rollback" | "leave",
                 "reason": str, "done": bool,
                 "result": "committed" | "rolled back" | "already finished" | null}],
    "data_loss": [{"sink_id": str, "batch_id": int, "partition_id": int | null,
                   "gid": str}],
    "checkpoint": null | {"path": str, "query_id": str, "sink_id": str,
                   "bound_query_id": str | null,
                   "last_offsets_batch": int | null, "last_committed_batch": int | null,
                   "problems": [str],
                   "batches": [{"batch_id": int, "offsets": bool,
                                "spark_committed": bool,
                                "decision": "complete" | "incomplete" | "none",
                                "rows": int | null, "state": str,
                                "level": "ok" | "info" | "warning", "message": str}]}

    SESSION = {"pid": int, "application_name": str, "user": str | null,
               "client": str | null, "state": str | null,
               "backend_start": ISO-8601 | null}

``actions`` lists every prepared transaction of the cluster: the sinks' (commit or
rollback, or leave when not provably theirs) and everybody else's (leave).
Checkpoint states: see ``sqlsink.checkpoint.STATES``.

``status`` adds::

    "server_time": ISO-8601, "max_age_seconds": float,
    "sinks": [{"sink_id": str, "bound_query_id": str | null, "bound_at": ISO-8601 | null,
               "decisions": int, "last_decided_batch": int | null,
               "last_complete_batch": int | null, "incomplete_batches": [int],
               "recent_batches": [{"batch_id": int, "rows": int, "gids": int,
                                   "decided_at": ISO-8601, "completed_at": ISO-8601 | null,
                                   "query_id": str | null, "run_id": str | null,
                                   "rows_per_second": float | null,
                                   "lag_seconds": float | null, "commit_ms": float | null,
                                   "orphans": int | null}],
               "prepared": [{"gid": str, "batch_id": int, "partition_id": int,
                             "run_id": str, "database": str, "owner": str,
                             "prepared_at": ISO-8601, "age_seconds": float,
                             "decided": bool}],
               "live": bool, "sessions": [SESSION], "lock_holders": [SESSION]}],
    "other_prepared": [{"gid": str, "database": str, "owner": str,
                        "prepared_at": ISO-8601, "age_seconds": float, "reason": str}],
    "data_loss": [{"sink_id": str, "batch_id": int, "partition_id": int | null, "gid": str}]

``check`` adds::

    "server_version": str, "trigger_interval_seconds": float | null,
    "findings": [{"level": "ok" | "info" | "warning" | "error", "setting": str,
                  "value": str | null, "source": str | null, "message": str,
                  "fix": str | null}]

``check`` exits 2 when a finding is an error (the sink cannot run there as this role),
1 on warnings.

Usage errors (a bad flag, a malformed duration or sink id) are argparse's: a message
on stderr and exit 2, without JSON. Human output goes to stdout; progress, notes and
one-line errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, TextIO
from urllib.parse import quote

import psycopg

from sqlsink.checkpoint import Checkpoint, DecisionState, read_checkpoint, relate
from sqlsink.core.committer import Committer, data_loss_error
from sqlsink.core.gid import Gid, check_sink_id
from sqlsink.core.model import PreparedTransaction, ResolutionReport
from sqlsink.core.resolution import Action, Plan, PlannedAction, Scope, plan_resolution
from sqlsink.errors import ConfigError, DataLossError, SqlsinkError, TransientError
from sqlsink.options import parse_duration
from sqlsink.postgres import status as st
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.connection import Connection, connect, redact, secrets_of, shown

JSON_VERSION = 1
PROGRESS_EVERY = 100
EXIT_OK, EXIT_WARN, EXIT_ERROR, EXIT_LOSS = 0, 1, 2, 3

FORCE_HELP = """\
recover even though the sink looks live (its partition tasks or its committer
are connected, or another session holds the sink's lock). The tool still takes
the sink's lock, waiting up to --lock-timeout, so it never acts in the middle
of a commit. What it risks: the gids of a batch that the live driver is about
to decide are rolled back; that batch then fails its commit ("no longer
prepared") and Spark retries it. Never data loss: before writing a decision the
committer re-checks, under the same lock, that every gid is still prepared.
A running query resolves its own leftovers at its next batch: you rarely need
this. Use it when the "live" session is a stuck or dead process."""

SCHEMA_FIX = (
    "the schema is created by the sink's first run (its role needs CREATE on the "
    "database); or run sql/001_commit_log.sql as the sink's role (sql/setup_role.sql "
    "sets up a least-privilege role). Check also that --url names the sink's database"
)


# -- errors and output --------------------------------------------------------------------


class CliError(Exception):
    """A failure reported as one line with its fix."""

    def __init__(self, message: str, fix: str | None = None, exit_code: int = EXIT_ERROR):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code


@dataclass
class Notice:
    level: str  # info | warning | error
    message: str
    fix: str | None = None
    sink_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "sink_id": self.sink_id,
            "message": self.message,
            "fix": self.fix,
        }


class Output:
    """All output goes through here: no password ever leaves, whatever the text."""

    def __init__(self, json_mode: bool, url: str | None, stdout: TextIO, stderr: TextIO) -> None:
        self.json_mode = json_mode
        self.stdout = stdout
        self.stderr = stderr
        self.url = url or ""
        secrets = secrets_of(self.url, os.environ.get("PGPASSWORD"))
        variants: set[str] = set()
        for secret in secrets:
            variants |= {secret, quote(secret, safe=""), json.dumps(secret)[1:-1]}
        self.secrets = sorted((v for v in variants if v), key=len, reverse=True)

    def clean(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return redact(text)

    def line(self, text: str = "") -> None:
        """A line of the human report (nothing in JSON mode)."""
        if not self.json_mode:
            self.stdout.write(self.clean(text) + "\n")
            self.stdout.flush()

    def note(self, text: str) -> None:
        """Progress and notes on stderr (human mode only)."""
        if not self.json_mode:
            self.stderr.write(self.clean(text) + "\n")
            self.stderr.flush()

    def error(self, text: str) -> None:
        self.stderr.write(self.clean(text) + "\n")
        self.stderr.flush()

    def emit_json(self, doc: dict[str, Any]) -> None:
        # clean each string value, then dump: cleaning the dumped text could break its syntax
        text = json.dumps(self._clean_values(doc), indent=2, default=_json_default)
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def _clean_values(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.clean(value)
        if isinstance(value, dict):
            return {k: self._clean_values(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._clean_values(v) for v in value]
        return value

    @property
    def shown_url(self) -> str:
        return self.clean(shown(self.url))


def _json_default(value: object) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], right: Collection[int] = ()
) -> list[str]:
    """An aligned text table; the last column is left unpadded."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))

    def fmt(row: Sequence[str]) -> str:
        parts = []
        for i, c in enumerate(row):
            if i == len(row) - 1:
                parts.append(c)
            elif i in right:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    return [fmt(list(headers)), *(fmt(r) for r in cells)]


def format_age(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(sep=" ", timespec="seconds")


def session_json(s: st.Session) -> dict[str, Any]:
    return {
        "pid": s.pid,
        "application_name": s.application_name,
        "user": s.user,
        "client": s.client,
        "state": s.state,
        "backend_start": s.backend_start,
    }


# -- arguments ----------------------------------------------------------------------------


def _duration(text: str) -> float:
    try:
        return parse_duration("duration", text)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (e.g. 0s, 30s, 500ms, 5min, 2h)"
        ) from None


def _sink_id(text: str) -> str:
    try:
        return check_sink_id(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sqlsink",
        description="On-call tool of the sqlsink exactly-once sink: resolve prepared "
        "transactions, show the commit log, check the server.",
        epilog="Exit codes: 0 all well; 1 warnings or something left to do; 2 usage, "
        "connection or permission error; 3 data loss.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--url",
            default=os.environ.get("SQLSINK_URL"),
            help="PostgreSQL URL or conninfo of the sink's database (default: $SQLSINK_URL). "
            "Prefer PGPASSWORD or ~/.pgpass to a password in the URL",
        )
        p.add_argument(
            "--json",
            action="store_true",
            help="one JSON object on stdout (see the "
            "module documentation of sqlsink.cli for its shape)",
        )

    recover = sub.add_parser(
        "recover",
        help="commit or roll back the prepared transactions a sink left behind",
        description="Resolve the prepared transactions of a sink (or of every sink in the "
        "database) with the sink's own rule: a gid its batch's decision names is committed, "
        "any other gid of the sink is rolled back; transactions not provably the sink's "
        "(other applications, other sinks, other databases) are never touched. Refuses "
        "while the sink is live unless --force.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    common(recover)
    recover.add_argument(
        "--sink-id",
        type=_sink_id,
        help="the sink to recover (default: every "
        "sink with leftovers;\nwith --checkpoint: the checkpoint's query id)",
    )
    recover.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="the query's checkpoint directory: "
        "report how Spark's\noffsets/commits relate to the commit log; refuse if "
        "the sink\nis bound to another query",
    )
    recover.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    recover.add_argument("--force", action="store_true", help=FORCE_HELP)
    recover.add_argument(
        "--lock-timeout",
        type=_duration,
        default=30.0,
        metavar="DURATION",
        help="with --force: how long to wait for the sink's lock (default 30s)",
    )
    recover.set_defaults(handler=cmd_recover)

    status = sub.add_parser("status", help="the commit log, open prepared transactions, warnings")
    common(status)
    status.add_argument("--sink-id", type=_sink_id, help="only this sink (default: every sink)")
    status.add_argument(
        "--max-age",
        type=_duration,
        default=300.0,
        metavar="DURATION",
        help="warn about prepared transactions and unfinished decisions "
        "older than this (default 5min)",
    )
    status.add_argument(
        "--batches",
        type=_positive_int,
        default=5,
        metavar="N",
        help="how many recent batches to show per sink (default 5)",
    )
    status.set_defaults(handler=cmd_status)

    check = sub.add_parser("check", help="the server settings and privileges the sink needs")
    common(check)
    check.add_argument(
        "--trigger-interval",
        type=_duration,
        metavar="DURATION",
        help="the query's trigger interval, to judge timeouts against",
    )
    check.set_defaults(handler=cmd_check)
    return parser


# -- entry point --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Output(args.json, args.url, sys.stdout, sys.stderr)
    doc: dict[str, Any] = {
        "version": JSON_VERSION,
        "command": args.command,
        "url": out.shown_url if args.url else None,
        "database": None,
        "role": None,
        "superuser": None,
        "warnings": [],
        "error": None,
        "exit_code": EXIT_OK,
    }
    try:
        if not args.url:
            raise CliError("no database given", "pass --url URL or set SQLSINK_URL")
        handler: Callable[[argparse.Namespace, Output, dict[str, Any]], int] = args.handler
        code = handler(args, out, doc)
    except CliError as exc:
        code = _fail(out, doc, exc.message, exc.fix, exc.exit_code)
    except DataLossError as exc:
        code = _fail(out, doc, exc.message, None, EXIT_LOSS)
    except TransientError as exc:
        code = _fail(
            out,
            doc,
            exc.message,
            "check that the server is up, and the host, port, "
            "database and user of --url (and PGPASSWORD / ~/.pgpass)",
        )
    except SqlsinkError as exc:
        code = _fail(out, doc, exc.message, None)
    except psycopg.errors.InsufficientPrivilege as exc:
        code = _fail(
            out,
            doc,
            _diag(exc)
            if _diag(exc).startswith("permission denied")
            else f"permission denied: {_diag(exc)}",
            "connect as the sink's role (the owner of the sqlsink schema) or a superuser",
        )
    except psycopg.errors.UndefinedTable as exc:
        code = _fail(out, doc, f"the sqlsink commit log is incomplete: {_diag(exc)}", SCHEMA_FIX)
    except psycopg.OperationalError as exc:
        code = _fail(
            out,
            doc,
            f"lost the connection to PostgreSQL: {_diag(exc)}",
            "run the command again: recovery is idempotent",
        )
    except psycopg.Error as exc:
        code = _fail(out, doc, f"PostgreSQL error: {_diag(exc)}", None)
    except KeyboardInterrupt:
        out.error("sqlsink: interrupted")
        return 130
    except BrokenPipeError:  # e.g. | head: stop quietly
        return _broken_pipe()
    except Exception:  # a bug: show where, without secrets
        out.error("sqlsink: internal error (please report it):\n" + traceback.format_exc())
        code = EXIT_ERROR
        doc["error"] = {"message": "internal error", "fix": None}
    doc["exit_code"] = code
    if out.json_mode:
        try:
            out.emit_json(doc)
        except BrokenPipeError:
            return _broken_pipe()
    return code


def _broken_pipe() -> int:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout at exit: let it go nowhere
    return EXIT_WARN


def _diag(exc: psycopg.Error) -> str:
    return (exc.diag.message_primary or str(exc)).strip()


def _fail(
    out: Output, doc: dict[str, Any], message: str, fix: str | None, code: int = EXIT_ERROR
) -> int:
    doc["error"] = {"message": message, "fix": fix}
    text = f"sqlsink {doc['command']}: error: {message.rstrip('. ')}"
    if fix:
        text += f". Fix: {fix}"
    out.error(" ".join(text.split()))  # one line, whatever the server's message holds
    return code


def open_connection(url: str, command: str) -> Connection:
    os.environ.setdefault("PGCONNECT_TIMEOUT", "10")
    return connect(url, application_name=f"sqlsink {command} (cli)")


def _identify(conn: Connection, doc: dict[str, Any]) -> st.RoleInfo:
    me = st.role_info(conn)
    doc.update(database=me.database, role=me.role, superuser=me.superuser)
    return me


def _require_schema(conn: Connection, me: st.RoleInfo) -> None:
    if st.schema_version(conn) == 0:
        raise CliError(
            f"the sqlsink schema (the commit log) is not installed in database {me.database}",
            SCHEMA_FIX,
        )


def _header(out: Output, command: str, me: st.RoleInfo, extra: str = "") -> None:
    who = "superuser" if me.superuser else "not superuser"
    out.line(
        f"sqlsink {command} on {out.shown_url}: database {me.database}, role {me.role} "
        f"({who}){extra}"
    )


def _exit_code(warnings: Sequence[Notice], lost: bool = False, failed: bool = False) -> int:
    if lost:
        return EXIT_LOSS
    if failed:
        return EXIT_ERROR
    if any(w.level in ("warning", "error") for w in warnings):
        return EXIT_WARN
    return EXIT_OK


def _print_warnings(out: Output, warnings: Sequence[Notice]) -> None:
    shown = [w for w in warnings if w.level != "info"] + [w for w in warnings if w.level == "info"]
    if not shown:
        return
    out.line()
    for w in shown:
        who = f"sink {w.sink_id}: " if w.sink_id else ""
        out.line(f"{w.level.upper()}: {who}{w.message}")
        if w.fix:
            out.line(f"    fix: {w.fix}")


# -- recover ------------------------------------------------------------------------------


class RecordingBackend(PostgresBackend):
    """The sink's backend, recording each COMMIT/ROLLBACK PREPARED and showing progress."""

    def __init__(self, conn: Connection, progress: Callable[[int], None]) -> None:
        super().__init__(conn)
        self.progress = progress
        self.finished: dict[str, str] = {}  # gid -> committed | rolled back | already finished

    def commit_prepared(self, gid: str) -> bool:
        return self._record(gid, super().commit_prepared(gid), "committed")

    def rollback_prepared(self, gid: str) -> bool:
        return self._record(gid, super().rollback_prepared(gid), "rolled back")

    def _record(self, gid: str, done: bool, what: str) -> bool:
        self.finished[gid] = what if done else "already finished"
        self.progress(len(self.finished))
        return done


@dataclass
class SinkRun:
    sink_id: str
    bound_query: str | None
    locked: bool = False  # this session holds the sink's lock now
    lock_busy: bool = False  # another session held it when we tried
    holders: list[st.Session] = field(default_factory=list)
    sessions: list[st.Session] = field(default_factory=list)
    status: str = "planned"
    message: str | None = None
    plan: Plan | None = None
    report: ResolutionReport | None = None
    lost: list[tuple[int, str]] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.lock_busy or bool(self.holders or self.sessions)

    def evidence(self) -> str:
        parts = []
        if self.holders:
            parts.append("its lock is held by " + ", ".join(s.describe() for s in self.holders))
        holders = {s.pid for s in self.holders}
        sessions = [s for s in self.sessions if s.pid not in holders]
        if sessions:
            parts.append("connected: " + ", ".join(s.describe() for s in sessions[:5]))
            if len(sessions) > 5:
                parts[-1] += f" and {len(sessions) - 5} more"
        return "; ".join(parts) or "its lock is held by another session"

    def to_do(self) -> list[PlannedAction]:
        return [a for a in (self.plan.actions if self.plan else []) if a.action is not Action.LEAVE]


def cmd_recover(args: argparse.Namespace, out: Output, doc: dict[str, Any]) -> int:
    doc.update(
        dry_run=args.dry_run, forced=args.force, sinks=[], actions=[], data_loss=[], checkpoint=None
    )
    checkpoint = read_checkpoint(args.checkpoint) if args.checkpoint else None
    sink_id: str | None = args.sink_id
    if sink_id is None and checkpoint is not None:
        sink_id = _sink_id_of_checkpoint(checkpoint)
    with open_connection(args.url, "recover") as conn:
        me = _identify(conn, doc)
        _require_schema(conn, me)
        total = [0]
        backend = RecordingBackend(conn, lambda n: _progress(out, n, total[0]))
        warnings: list[Notice] = []
        bound = st.sinks(conn)
        if checkpoint is not None and sink_id is not None:
            _check_checkpoint_binding(checkpoint, sink_id, bound, me)
        mode = " (dry run: nothing is changed)" if args.dry_run else ""
        _header(out, "recover", me, mode)

        targets = [sink_id] if sink_id else _sinks_with_leftovers(conn, backend)
        runs = [SinkRun(s, bound[s].query_id if s in bound else None) for s in targets]
        try:
            for run in runs:
                _prepare_run(conn, backend, run, args, me, warnings, out)
            _act(out, backend, runs, args, total)
        finally:
            for run in runs:
                if run.locked:
                    st.unlock_sink(conn, run.sink_id)
                    run.locked = False

        now = st.server_now(conn)
        actions = _all_actions(conn, runs, backend, sink_id, now)
        lost = [(run.sink_id, batch, gid) for run in runs for batch, gid in run.lost]
        for run in runs:
            _sink_warnings(run, args, warnings, out)
        if (
            sink_id is not None
            and sink_id not in bound
            and not any(a["sink_id"] == sink_id for a in actions)
        ):
            warnings.append(
                Notice(
                    "warning",
                    f"sink {sink_id} is unknown in database {me.database}: no commit log rows and "
                    "no prepared transactions",
                    "check --sink-id (the sinkId option, else the query id) and that --url names "
                    "the sink's database",
                    sink_id,
                )
            )
        _foreign_warnings(actions, sink_id, me, warnings)

        checkpoint_doc = None
        if checkpoint is not None and sink_id is not None:
            checkpoint_doc = _relate_checkpoint(conn, checkpoint, sink_id, bound, warnings)

        _print_recover(out, runs, actions, lost, checkpoint_doc, args)
        _print_warnings(out, warnings)

        doc["sinks"] = [_run_json(r, actions) for r in runs]
        doc["actions"] = actions
        doc["data_loss"] = [_loss_json(s, b, g) for s, b, g in lost]
        doc["checkpoint"] = checkpoint_doc
        doc["warnings"] = [w.as_json() for w in warnings]
        failed = any(r.status == "failed" for r in runs)
        code = _exit_code(warnings, lost=bool(lost), failed=failed)
        if code == EXIT_OK and (
            any(r.status == "refused" for r in runs)
            or any(a["action"] != "leave" and a["result"] is None for a in actions)
        ):
            code = EXIT_WARN
        _print_result(out, runs, actions, args.dry_run, code)
        return code


def _sink_id_of_checkpoint(checkpoint: Checkpoint) -> str:
    try:
        return check_sink_id(checkpoint.query_id)
    except ConfigError:
        raise CliError(
            f"the checkpoint's query id {checkpoint.query_id[:80]!r} is not a valid sink id",
            "pass the sink's id with --sink-id",
        ) from None


def _check_checkpoint_binding(
    checkpoint: Checkpoint, sink_id: str, bound: dict[str, st.SinkRow], me: st.RoleInfo
) -> None:
    row = bound.get(sink_id)
    if row is None or row.query_id is None or row.query_id == checkpoint.query_id:
        return
    raise CliError(
        f"sink {sink_id} (database {me.database}) is bound to streaming query {row.query_id}, "
        f"but checkpoint {checkpoint.path} belongs to query {checkpoint.query_id}: this "
        "checkpoint and this sink do not belong together, so nothing was done",
        "pass the checkpoint of the query that writes this sink, or the sink id that this "
        "query uses (--sink-id); a new query reusing the sink id is refused by the sink too",
    )


def _sinks_with_leftovers(conn: Connection, backend: RecordingBackend) -> list[str]:
    """Every sink with a prepared gid in this database, or an incomplete decision."""
    found = {d.sink_id for d in st.incomplete_decisions(conn)}
    for txn in backend.prepared(None):
        gid = Gid.parse(txn.gid)
        if gid is not None and txn.database == backend.database:
            found.add(gid.sink_id)
    return sorted(found)


def _prepare_run(
    conn: Connection,
    backend: RecordingBackend,
    run: SinkRun,
    args: argparse.Namespace,
    me: st.RoleInfo,
    warnings: list[Notice],
    out: Output,
) -> None:
    """Liveness, the sink lock and the plan of one sink."""
    run.locked = st.try_sink_lock(conn, run.sink_id)
    run.lock_busy = not run.locked
    run.holders = [] if run.locked else st.lock_holders(conn, run.sink_id)
    run.sessions = st.sink_sessions(st.sqlsink_sessions(conn), run.sink_id)
    live = run.live
    committer = Committer(backend, run.sink_id)
    if args.dry_run:
        run.plan = committer.plan(Scope.everything())
        run.lost = _dry_run_losses(conn, run.plan)
        if run.locked:
            st.unlock_sink(conn, run.sink_id)
            run.locked = False
        run.status = "planned" if run.to_do() else "nothing to do"
        if run.lost:
            run.status = "data loss"
        if live:
            warnings.append(
                Notice(
                    "warning",
                    f"the sink looks live ({run.evidence()}); a real run would refuse without "
                    "--force",
                    None,
                    run.sink_id,
                )
            )
        return
    if live and not args.force:
        run.plan = committer.plan(Scope.everything())
        _refuse(
            conn,
            run,
            f"the sink is live: {run.evidence()}. Nothing was done for it: a "
            "running query resolves its own leftovers at its next batch",
        )
        return
    if not run.locked:
        out.note(
            f"sqlsink recover: sink {run.sink_id}: --force: waiting up to {args.lock_timeout:g}s "
            f"for the sink's lock ({run.evidence()})"
        )
        run.locked = st.wait_sink_lock(conn, run.sink_id, args.lock_timeout)
        if not run.locked:
            holders = st.lock_holders(conn, run.sink_id)
            run.holders = holders or run.holders
            run.plan = committer.plan(Scope.everything())
            _refuse(
                conn,
                run,
                f"the sink's lock is still held after {args.lock_timeout:g}s "
                f"({run.evidence()}); nothing was done for it",
            )
            return
    run.plan = committer.plan(Scope.everything())
    if not me.superuser:
        foreign_owner = sorted(
            {a.prepared.owner for a in run.to_do() if a.prepared.owner != me.role}
        )
        if foreign_owner:
            message = (
                f"transactions of this sink were prepared by role(s) {', '.join(foreign_owner)}; "
                f"only that role or a superuser may COMMIT/ROLLBACK PREPARED them, and this is "
                f"role {me.role}. Nothing was done for this sink. Fix: run recover connected "
                f"as {foreign_owner[0]} or as a superuser"
            )
            _refuse(conn, run, message, status="failed")


def _refuse(conn: Connection, run: SinkRun, message: str, status: str = "refused") -> None:
    """Nothing is done for this sink; data loss is still looked for (read-only)."""
    if run.locked:
        st.unlock_sink(conn, run.sink_id)
        run.locked = False
    run.status = status
    run.message = message
    if run.plan is not None:
        run.lost = _dry_run_losses(conn, run.plan)


def _dry_run_losses(conn: Connection, plan: Plan) -> list[tuple[int, str]]:
    """Decided gids gone without their marker (read-only; confirmed by a second read)."""
    candidates = {gid for _, gid in plan.to_verify}
    gone = candidates - st.visible_markers(conn, candidates)
    lost = st.confirm_lost(conn, gone)
    return [(batch, gid) for batch, gid in plan.to_verify if gid in lost]


def _progress(out: Output, done: int, total: int) -> None:
    if done % PROGRESS_EVERY == 0:
        out.note(f"sqlsink recover: {done}/{total} prepared transactions finished")


def _act(
    out: Output,
    backend: RecordingBackend,
    runs: list[SinkRun],
    args: argparse.Namespace,
    total: list[int],
) -> None:
    if args.dry_run:
        return
    total[0] = sum(len(r.to_do()) for r in runs if r.locked)
    if total[0] >= PROGRESS_EVERY:
        out.note(f"sqlsink recover: finishing {total[0]} prepared transactions ...")
    for run in runs:
        if not run.locked:
            continue
        committer = Committer(backend, run.sink_id)
        try:
            run.plan, run.report = committer.recover()
            run.status = (
                "recovered"
                if run.report.committed
                or run.report.rolled_back
                or run.report.completed_batches
                or run.report.already_committed
                else "nothing to do"
            )
        except DataLossError as exc:
            run.status = "data loss"
            run.lost = list(exc.context.get("lost", []))
            run.message = exc.message
        except ConfigError as exc:  # e.g. COMMIT PREPARED by a role that did not prepare
            run.status = "failed"
            run.message = exc.message
        finally:
            st.unlock_sink(backend.conn, run.sink_id)
            run.locked = False


def _all_actions(
    conn: Connection,
    runs: list[SinkRun],
    backend: RecordingBackend,
    sink_id: str | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """Every prepared transaction seen: the sinks' plans, then everybody else's (leave)."""
    seen: dict[str, PlannedAction] = {}
    for run in runs:
        for action in run.plan.actions if run.plan else []:
            if action.prepared.gid not in seen or action.action is not Action.LEAVE:
                seen[action.prepared.gid] = action
    rest = [t for t in st.all_prepared(conn) if t.gid not in seen]
    # the others: labelled by the same rule, which leaves whatever is not the sink's
    others = plan_resolution(
        rest, {}, database=backend.database, sink_id=sink_id, scope=Scope.everything()
    )
    for action in others.actions:
        if action.action is not Action.LEAVE:  # a sink's gid that appeared after the listing
            reason = "prepared after this run listed the sinks: run recover again"
            action = PlannedAction(action.prepared, action.gid, Action.LEAVE, reason)
        seen[action.prepared.gid] = action
    rows = [_action_json(a, backend.finished.get(a.prepared.gid), now) for a in seen.values()]
    rows.sort(
        key=lambda j: (
            j["action"] == "leave", j["sink_id"] or "", j["batch_id"] or 0,
            j["partition_id"] or 0, j["gid"],
        )
    )  # fmt: skip
    return rows


def _action_json(action: PlannedAction, result: str | None, now: datetime) -> dict[str, Any]:
    txn, gid = action.prepared, action.gid
    acts = action.action is not Action.LEAVE
    return {
        "gid": txn.gid,
        "sink_id": gid.sink_id if gid else None,
        "batch_id": gid.batch_id if gid else None,
        "partition_id": gid.partition_id if gid else None,
        "run_id": gid.run_id if gid else None,
        "database": txn.database,
        "owner": txn.owner,
        "prepared_at": txn.prepared_at,
        "age_seconds": round((now - txn.prepared_at).total_seconds(), 3),
        "action": action.action.value,
        "reason": action.reason,
        "done": acts and result in ("committed", "rolled back"),
        "result": result if acts else None,
    }


def _sink_warnings(
    run: SinkRun, args: argparse.Namespace, warnings: list[Notice], out: Output
) -> None:
    fix_cmd = f"sqlsink recover --url '{out.shown_url}' --sink-id {run.sink_id}"
    if run.status == "refused":
        warnings.append(
            Notice(
                "warning",
                run.message or "refused",
                f"stop the query and run: {fix_cmd}; or, if the live session is stuck or dead, "
                f"add --force (see sqlsink recover --help)",
                run.sink_id,
            )
        )
    elif run.status == "failed":
        warnings.append(Notice("error", run.message or "failed", None, run.sink_id))
    elif args.dry_run and run.to_do() and not run.lost:
        n = len(run.to_do())
        warnings.append(
            Notice("info", f"{n} prepared transaction(s) to finish", f"run: {fix_cmd}", run.sink_id)
        )
    if run.lost:
        warnings.append(
            Notice(
                "error",
                run.message
                if run.status == "data loss" and run.message
                else _loss_message(run.lost),
                "see the README's 'data loss' runbook; the decision stays incomplete, so "
                "status and recover report it until it is dealt with",
                run.sink_id,
            )
        )


def _loss_message(lost: list[tuple[int, str]]) -> str:
    """The sink's own data-loss message (each lost batch, partition and gid; the runbook)."""
    return data_loss_error(lost).message


def _foreign_warnings(
    actions: list[dict[str, Any]],
    sink_id: str | None,
    me: st.RoleInfo,
    warnings: list[Notice],
) -> None:
    """The sink's gids in other databases: said, because they need a recover there."""
    elsewhere: dict[str, int] = {}
    for a in actions:
        ours = a["sink_id"] is not None and (sink_id is None or a["sink_id"] == sink_id)
        if ours and a["database"] != me.database:
            elsewhere[a["database"]] = elsewhere.get(a["database"], 0) + 1
    for database, count in sorted(elsewhere.items()):
        level = "warning" if sink_id is not None else "info"
        who = f"sink {sink_id}" if sink_id else "sqlsink"
        warnings.append(
            Notice(
                level,
                f"{count} prepared transaction(s) of {who} are in database {database}, not in "
                f"{me.database}: left untouched (a prepared transaction can only be finished "
                "from its own database)",
                f"run recover with --url naming database {database}",
                sink_id,
            )
        )


def _relate_checkpoint(
    conn: Connection,
    checkpoint: Checkpoint,
    sink_id: str,
    bound: dict[str, st.SinkRow],
    warnings: list[Notice],
) -> dict[str, Any]:
    known = set(checkpoint.offsets) | checkpoint.commits
    oldest = min(known) if known else 0
    decisions = st.decisions_from(conn, sink_id, oldest)
    summary = st.batch_summary(conn, sink_id)
    database = str(conn.info.dbname)
    prepared: dict[str, Gid] = {}
    for txn in st.all_prepared(conn):
        gid = Gid.parse(txn.gid)
        if gid is not None and gid.sink_id == sink_id and txn.database == database:
            prepared[txn.gid] = gid
    states = {
        b: DecisionState(
            d.completed_at is not None, d.rows, len(d.gids), sum(1 for g in d.gids if g in prepared)
        )
        for b, d in decisions.items()
    }
    undecided: dict[int, int] = {}
    for gid in prepared.values():
        if gid.batch_id not in decisions and gid.batch_id >= oldest:
            undecided[gid.batch_id] = undecided.get(gid.batch_id, 0) + 1
    relations = relate(
        checkpoint, states, undecided_prepared=undecided, first_decided=summary.first_decided
    )
    for problem in checkpoint.problems:
        warnings.append(Notice("warning", f"checkpoint: {problem}", None, sink_id))
    for r in relations:
        if r.level == "warning":
            warnings.append(Notice("warning", r.message, None, sink_id))
    row = bound.get(sink_id)
    return {
        "path": str(checkpoint.path),
        "query_id": checkpoint.query_id,
        "sink_id": sink_id,
        "bound_query_id": row.query_id if row else None,
        "last_offsets_batch": checkpoint.last_offsets,
        "last_committed_batch": checkpoint.last_commit,
        "problems": list(checkpoint.problems),
        "batches": [asdict(r) for r in relations],
    }


def _run_json(run: SinkRun, actions: list[dict[str, Any]]) -> dict[str, Any]:
    report = run.report or ResolutionReport()
    results = [a["result"] for a in actions if a["sink_id"] == run.sink_id]
    return {
        "sink_id": run.sink_id,
        "bound_query_id": run.bound_query,
        "live": run.live,
        "lock": "held" if run.lock_busy else "free",
        "lock_holders": [session_json(s) for s in run.holders],
        "sessions": [session_json(s) for s in run.sessions],
        "status": run.status,
        "message": run.message,
        "committed": results.count("committed"),
        "rolled_back": results.count("rolled back"),
        "already_committed": len(report.already_committed),
        "completed_batches": sorted(report.completed_batches),
    }


def _loss_json(sink_id: str, batch_id: int, gid: str) -> dict[str, Any]:
    parsed = Gid.parse(gid)
    return {
        "sink_id": sink_id,
        "batch_id": batch_id,
        "partition_id": parsed.partition_id if parsed else None,
        "gid": gid,
    }


def _print_recover(
    out: Output,
    runs: list[SinkRun],
    actions: list[dict[str, Any]],
    lost: list[tuple[str, int, str]],
    checkpoint_doc: dict[str, Any] | None,
    args: argparse.Namespace,
) -> None:
    if out.json_mode:
        return
    if not runs:
        out.line("no sink has prepared transactions or unfinished decisions in this database")
    for run in runs:
        bound = f"bound to query {run.bound_query}" if run.bound_query else "not bound to a query"
        live = "LIVE" if run.live else "not live"
        out.line(f"sink {run.sink_id}: {bound}; {live}; {run.status}")
    refused = {r.sink_id for r in runs if r.status in ("refused", "failed")}
    acted = [a for a in actions if a["action"] != "leave"]
    left = [a for a in actions if a["action"] == "leave"]
    out.line()
    if acted:
        rows = [
            [
                j["gid"], j["sink_id"], j["batch_id"], j["partition_id"],
                format_age(j["age_seconds"]), j["owner"], j["action"],
                f"would {j['action']}" if args.dry_run
                else j["result"] or ("refused" if j["sink_id"] in refused else "not done"),
                j["reason"],
            ]
            for j in acted
        ]  # fmt: skip
        head = ["GID", "SINK", "BATCH", "PART", "AGE", "OWNER", "ACTION", "DONE", "REASON"]
        for text in table(head, rows, right={2, 3, 4}):
            out.line(text)
    else:
        out.line("nothing to commit or roll back")
    if left:
        out.line()
        out.line("left untouched (not provably the recovered sinks', or not in this database):")
        rows = [
            [j["gid"], j["database"], j["owner"], format_age(j["age_seconds"]), j["reason"]]
            for j in left
        ]
        for text in table(["GID", "DATABASE", "OWNER", "AGE", "REASON"], rows, right={3}):
            out.line(text)
    if lost:
        out.line()
        out.line(
            "DATA LOSS: decided transactions that are neither prepared nor committed "
            "(rolled back by someone): their rows are missing"
        )
        for text in table(
            ["SINK", "BATCH", "PARTITION", "GID"],
            [[s, b, (p.partition_id if (p := Gid.parse(g)) else "?"), g] for s, b, g in lost],
            right={1, 2},
        ):
            out.line("  " + text)
    if checkpoint_doc is not None:
        _print_checkpoint(out, checkpoint_doc)


def _print_checkpoint(out: Output, doc: dict[str, Any]) -> None:
    out.line()
    last_o, last_c = doc["last_offsets_batch"], doc["last_committed_batch"]
    out.line(
        f"checkpoint {doc['path']} (query {doc['query_id']}): offsets up to batch "
        f"{'-' if last_o is None else last_o}, commits up to batch "
        f"{'-' if last_c is None else last_c}"
    )
    batches = doc["batches"]
    i = 0
    while i < len(batches):
        b = batches[i]
        if b["state"] == "consistent":
            j = i
            while (
                j + 1 < len(batches)
                and batches[j + 1]["state"] == "consistent"
                and batches[j + 1]["batch_id"] == batches[j]["batch_id"] + 1
            ):
                j += 1
            if j > i:
                out.line(
                    f"  batches {b['batch_id']}-{batches[j]['batch_id']}: committed in Spark "
                    "and in PostgreSQL"
                )
            else:
                out.line(f"  {b['message']}")
            i = j + 1
            continue
        mark = "!" if b["level"] == "warning" else " "
        out.line(f"{mark} {b['message']}")
        i += 1
    if not batches:
        out.line("  the checkpoint holds no batches yet, and the sink no decisions")


def _print_result(
    out: Output, runs: list[SinkRun], actions: list[dict[str, Any]], dry_run: bool, code: int
) -> None:
    results = [a["result"] for a in actions]  # what was done, even when a sink then failed
    committed, rolled = results.count("committed"), results.count("rolled back")
    already = sum(len(r.report.already_committed) for r in runs if r.report)
    completed = [
        f"{r.sink_id}: {', '.join(map(str, sorted(r.report.completed_batches)))}"
        for r in runs
        if r.report and r.report.completed_batches
    ]
    out.line()
    kinds = [a["action"] for a in actions]
    text = f"result: {committed} committed, {rolled} rolled back"
    if dry_run:
        text = (
            f"plan: {kinds.count('commit')} to commit, {kinds.count('rollback')} to roll back, "
            f"{kinds.count('leave')} left untouched"
        )
    if already:
        text += f", {already} found already committed"
    if completed:
        text += f"; batches completed: {'; '.join(completed)}"
    meaning = {
        0: "all resolved",
        1: "something is left to do (see above)",
        2: "errors (see above)",
        3: "DATA LOSS",
    }
    out.line(f"{text}. exit {code}: {meaning[code]}")


# -- status -------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, out: Output, doc: dict[str, Any]) -> int:
    doc.update(
        server_time=None, max_age_seconds=args.max_age, sinks=[], other_prepared=[], data_loss=[]
    )
    with open_connection(args.url, "status") as conn:
        me = _identify(conn, doc)
        _require_schema(conn, me)
        backend = PostgresBackend(conn)
        now = st.server_now(conn)
        doc["server_time"] = now
        rows = st.sinks(conn)
        prepared = st.all_prepared(conn)
        incomplete = st.incomplete_decisions(conn, args.sink_id)
        here: dict[str, list[tuple[PreparedTransaction, Gid]]] = {}
        others: list[tuple[PreparedTransaction, str]] = []
        for txn in prepared:
            gid = Gid.parse(txn.gid)
            if gid is None:
                others.append((txn, "not a sqlsink transaction"))
            elif txn.database != me.database:
                others.append((txn, f"sink {gid.sink_id}, in database {txn.database}"))
            elif args.sink_id is not None and gid.sink_id != args.sink_id:
                others.append((txn, f"belongs to sink {gid.sink_id}"))
            else:
                here.setdefault(gid.sink_id, []).append((txn, gid))
        names = set(rows) | set(here) | {d.sink_id for d in incomplete}
        if args.sink_id is not None:
            if args.sink_id not in names:
                known = ", ".join(sorted(rows)[:20]) or "none"
                raise CliError(
                    f"unknown sink {args.sink_id} in database {me.database} (known sinks: {known})",
                    "check --sink-id (the sinkId option, else the query id) and the database "
                    "in --url",
                )
            names = {args.sink_id}
        sessions = st.sqlsink_sessions(conn)
        warnings: list[Notice] = []
        lost_all: list[tuple[str, int, str]] = []
        statuses: list[SinkStatus] = []
        _header(out, "status", me, f", server time {format_time(now)}")
        for name in sorted(names):
            sink = _sink_status(
                conn, backend, name, rows.get(name), here.get(name, []), sessions, now, args,
                warnings, out,
            )  # fmt: skip
            statuses.append(sink)
            lost_all += [(name, b, g) for b, g in sink.lost]
        _print_status(out, statuses, detailed=args.sink_id is not None)
        other_docs: list[dict[str, Any]] = []
        for txn, reason in others:
            age = (now - txn.prepared_at).total_seconds()
            other_docs.append(
                {
                    "gid": txn.gid,
                    "database": txn.database,
                    "owner": txn.owner,
                    "prepared_at": txn.prepared_at,
                    "age_seconds": round(age, 3),
                    "reason": reason,
                }
            )
        old_others = [
            o
            for o in other_docs
            if o["age_seconds"] > args.max_age
            and o["database"] == me.database
            and args.sink_id is None
        ]
        if old_others:
            oldest = max(old_others, key=lambda o: o["age_seconds"])
            warnings.append(
                Notice(
                    "warning",
                    f"{len(old_others)} prepared transaction(s) in this database that are not a "
                    f"sink's are older than {format_age(args.max_age)} (oldest {oldest['gid']!r}, "
                    f"{format_age(oldest['age_seconds'])}, role {oldest['owner']}): a prepared "
                    "transaction holds its locks and blocks VACUUM until finished",
                    "not sqlsink's to resolve: find the application that prepared it; as a last "
                    "resort ROLLBACK PREPARED '<gid>' (as its owner or a superuser)",
                )
            )
        if other_docs and not out.json_mode:
            out.line()
            out.line("prepared transactions that are not this tool's to resolve:")
            for text in table(
                ["GID", "DATABASE", "OWNER", "AGE", "REASON"],
                [
                    [o["gid"], o["database"], o["owner"], format_age(o["age_seconds"]), o["reason"]]
                    for o in other_docs
                ],
                right={3},
            ):
                out.line("  " + text)
        if lost_all and not out.json_mode:
            out.line()
            out.line("DATA LOSS: decided transactions that are neither prepared nor committed:")
            for text in table(
                ["SINK", "BATCH", "PARTITION", "GID"],
                [
                    [s, b, (p.partition_id if (p := Gid.parse(g)) else "?"), g]
                    for s, b, g in lost_all
                ],
                right={1, 2},
            ):
                out.line("  " + text)
        _print_warnings(out, warnings)
        doc["sinks"] = [sink.doc for sink in statuses]
        doc["other_prepared"] = other_docs
        doc["data_loss"] = [_loss_json(s, b, g) for s, b, g in lost_all]
        doc["warnings"] = [w.as_json() for w in warnings]
        code = _exit_code(warnings, lost=bool(lost_all))
        if not out.json_mode:
            out.line()
            meaning = {0: "all well", 1: "warnings (see above)", 3: "DATA LOSS"}
            out.line(f"exit {code}: {meaning.get(code, '')}")
        return code


def _sink_status(
    conn: Connection,
    backend: PostgresBackend,
    sink_id: str,
    row: st.SinkRow | None,
    prepared: list[tuple[PreparedTransaction, Gid]],
    sessions: list[st.Session],
    now: datetime,
    args: argparse.Namespace,
    warnings: list[Notice],
    out: Output,
) -> SinkStatus:
    summary = st.batch_summary(conn, sink_id)
    recent = st.recent_decisions(conn, sink_id, args.batches)
    incomplete = st.incomplete_decisions(conn, sink_id)
    live_sessions = st.sink_sessions(sessions, sink_id)
    holders = st.lock_holders(conn, sink_id)
    # data loss: the core's own list of decided gids to verify, read-only, confirmed twice
    plan = Committer(backend, sink_id).plan(Scope.everything())
    candidates = {gid for _, gid in plan.to_verify}
    gone = candidates - st.visible_markers(conn, candidates)
    confirmed = st.confirm_lost(conn, gone)
    lost = [(b, g) for b, g in plan.to_verify if g in confirmed]
    batches_of_prepared = {(sink_id, gid.batch_id) for _, gid in prepared}
    decided_gids = {
        g for d in backend.decisions(sink_id, batches_of_prepared).values() for g in d.gids
    }
    fix_cmd = f"sqlsink recover --url '{out.shown_url}' --sink-id {sink_id}"
    prepared_docs: list[dict[str, Any]] = []
    for txn, gid in sorted(prepared, key=lambda p: (p[1].batch_id, p[1].partition_id, p[0].gid)):
        age = (now - txn.prepared_at).total_seconds()
        prepared_docs.append(
            {
                "gid": txn.gid,
                "batch_id": gid.batch_id,
                "partition_id": gid.partition_id,
                "run_id": gid.run_id,
                "database": txn.database,
                "owner": txn.owner,
                "prepared_at": txn.prepared_at,
                "age_seconds": round(age, 3),
                "decided": txn.gid in decided_gids,
            }
        )
    old = [p for p in prepared_docs if p["age_seconds"] > args.max_age]
    if old:
        oldest = max(old, key=lambda p: p["age_seconds"])
        warnings.append(
            Notice(
                "warning",
                f"{len(old)} prepared transaction(s) older than {format_age(args.max_age)} "
                f"(oldest: {oldest['gid']}, batch {oldest['batch_id']}, "
                f"{format_age(oldest['age_seconds'])}): "
                "a prepared transaction holds its locks and blocks VACUUM until it is finished",
                f"{fix_cmd}  (a running query resolves them at its next batch; if it is stopped "
                "or stuck, recover does)",
                sink_id,
            )
        )
    lost_batches = {b for b, _ in lost}
    stale = [
        d
        for d in incomplete
        if (now - d.decided_at).total_seconds() > args.max_age and d.batch_id not in lost_batches
    ]
    if stale:
        batches = ", ".join(str(d.batch_id) for d in stale[:10])
        warnings.append(
            Notice(
                "warning",
                f"{len(stale)} decided batch(es) not complete after {format_age(args.max_age)} "
                f"(batch {batches}): some of their transactions are still prepared, or unverified",
                fix_cmd,
                sink_id,
            )
        )
    if lost:
        warnings.append(
            Notice(
                "error",
                _loss_message(lost),
                "see the README's 'data loss' runbook; the decision stays incomplete, so "
                "status and recover report it until it is dealt with",
                sink_id,
            )
        )
    live = bool(live_sessions or holders)
    sink_doc = {
        "sink_id": sink_id,
        "bound_query_id": row.query_id if row else None,
        "bound_at": row.bound_at if row else None,
        "decisions": summary.decisions,
        "last_decided_batch": summary.last_decided,
        "last_complete_batch": summary.last_complete,
        "incomplete_batches": [d.batch_id for d in incomplete],
        "recent_batches": [
            {
                "batch_id": d.batch_id,
                "rows": d.rows,
                "gids": len(d.gids),
                "decided_at": d.decided_at,
                "completed_at": d.completed_at,
                "query_id": d.query_id,
                "run_id": d.run_id,
                "rows_per_second": d.rows_per_second(),
                "lag_seconds": d.lag_seconds(),
                "commit_ms": d.commit_ms,
                "orphans": d.orphans,
            }
            for d in recent
        ],
        "prepared": prepared_docs,
        "live": live,
        "sessions": [session_json(s) for s in live_sessions],
        "lock_holders": [session_json(s) for s in holders],
    }
    evidence = [f"lock held by {s.describe()}" for s in holders]
    evidence += [s.describe() for s in live_sessions if s.pid not in {h.pid for h in holders}]
    return SinkStatus(sink_doc, lost, evidence)


@dataclass
class SinkStatus:
    doc: dict[str, Any]  # the JSON of the sink
    lost: list[tuple[int, str]]
    live: list[str]  # the evidence, for the human report


def _print_status(out: Output, sinks: list[SinkStatus], *, detailed: bool) -> None:
    """A table of every sink, then the details of those with something to show."""
    if out.json_mode:
        return
    if not sinks:
        out.line("no sinks in this database")
        return
    out.line()
    head = ["SINK", "QUERY", "LAST_DECIDED", "LAST_COMPLETE", "INCOMPLETE", "PREPARED", "OLDEST"]
    rows = []
    for sink in sinks:
        d = sink.doc
        oldest = max((p["age_seconds"] for p in d["prepared"]), default=None)
        rows.append(
            [
                d["sink_id"],
                d["bound_query_id"],
                d["last_decided_batch"],
                d["last_complete_batch"],
                len(d["incomplete_batches"]),
                len(d["prepared"]),
                None if oldest is None else format_age(oldest),
                " ".join((["LIVE"] if d["live"] else []) + (["DATA LOSS"] if sink.lost else [])),
            ]
        )
    for text in table([*head, "STATE"], rows, right={2, 3, 4, 5, 6}):
        out.line(text)
    for sink in sinks:
        d = sink.doc
        if detailed or d["prepared"] or d["incomplete_batches"] or d["live"] or sink.lost:
            _print_sink_status(out, sink)


def _print_sink_status(out: Output, sink: SinkStatus) -> None:
    doc = sink.doc
    out.line()
    bound = doc["bound_query_id"]
    out.line(f"sink {doc['sink_id']}  ({f'query {bound}' if bound else 'not bound to a query'})")
    if sink.live:
        out.line(f"  live: {'; '.join(sink.live[:6])}")
    else:
        out.line("  live: no session of this sink is connected")
    if doc["recent_batches"]:
        out.line("  recent batches:")
        rows = [
            [
                d["batch_id"],
                d["rows"],
                d["gids"],
                format_time(d["decided_at"]),
                format_time(d["completed_at"]) if d["completed_at"] else "NOT COMPLETE",
                "-" if d["rows_per_second"] is None else f"{d['rows_per_second']:,.0f}",
                "-" if d["lag_seconds"] is None else f"{d['lag_seconds']:.2f}s",
            ]
            for d in doc["recent_batches"]
        ]
        headers = ["BATCH", "ROWS", "GIDS", "DECIDED_AT", "COMPLETED_AT", "ROWS/S", "LAG"]
        for text in table(headers, rows, right={0, 1, 2, 5, 6}):
            out.line("    " + text)
    if doc["prepared"]:
        out.line(f"  open prepared transactions: {len(doc['prepared'])}")
        rows = [
            [
                p["gid"],
                p["batch_id"],
                p["partition_id"],
                format_age(p["age_seconds"]),
                p["owner"],
                "yes" if p["decided"] else "no",
            ]
            for p in doc["prepared"]
        ]
        for text in table(
            ["GID", "BATCH", "PART", "AGE", "OWNER", "DECIDED"], rows, right={1, 2, 3}
        ):
            out.line("    " + text)
    else:
        out.line("  open prepared transactions: none")


# -- check --------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace, out: Output, doc: dict[str, Any]) -> int:
    doc.update(server_version=None, trigger_interval_seconds=args.trigger_interval, findings=[])
    with open_connection(args.url, "check") as conn:
        me = _identify(conn, doc)
        doc["server_version"] = me.server_version
        findings = st.run_checks(conn, st.CheckContext(args.trigger_interval))
    doc["findings"] = [
        {
            "level": f.level,
            "setting": f.setting,
            "value": f.value,
            "source": f.source,
            "message": f.message,
            "fix": f.fix,
        }
        for f in findings
    ]
    levels = {f.level for f in findings}
    code = EXIT_ERROR if "error" in levels else EXIT_WARN if "warning" in levels else EXIT_OK
    if not out.json_mode:
        _header(out, "check", me, f", PostgreSQL {me.server_version}")
        out.line()
        rows = [[f.level.upper(), f.setting, f.value, f.source, f.message] for f in findings]
        lines = table(["LEVEL", "SETTING", "VALUE", "SOURCE", "MESSAGE"], rows)
        out.line(lines[0])
        for text, f in zip(lines[1:], findings, strict=True):
            out.line(text)
            if f.fix:
                out.line(f"    fix: {f.fix}")
        meaning = {
            0: "the server is ready for the sink",
            1: "warnings (see above)",
            2: "the sink cannot run here as it is (see the errors above)",
        }
        out.line()
        out.line(f"exit {code}: {meaning[code]}")
    return code
