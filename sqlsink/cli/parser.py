"""The command line: its arguments, and ``main``, which runs a command and maps every
failure to one line on stderr (and the document's ``error``) and an exit code.

Usage errors (a bad flag, a malformed duration or sink id) are argparse's: a message
on stderr and exit 2, without JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlsink.backends import open_database
from sqlsink.cli import check, forget, metrics, recover, status
from sqlsink.cli.contract import Envelope
from sqlsink.cli.output import (
    EXIT_ERROR,
    EXIT_LOSS,
    EXIT_WARN,
    CliError,
    Output,
    fail,
    new_envelope,
)
from sqlsink.core.admin import DriverFault
from sqlsink.core.gid import check_sink_id
from sqlsink.errors import ConfigError, DataLossError, SqlsinkError, TransientError
from sqlsink.options import parse_duration

FORCE_HELP = """\
declare the run(s) named by --run-id dead, then recover. Needs
--sink-id (or --checkpoint) and at least one --run-id: nothing is
fenced that you did not name. Each named run is fenced in the commit
log (sqlsink.runs: superseded_by 'operator'): from then on its tasks,
commits and aborts are refused (FencedError), and a task of it that
prepares later rolls itself back; a session provably the run's (one
that holds the sink's lock, as the run recorded its pid and start)
is ended. Then the sink is recovered with those runs as dead: their
decided transactions are committed, the others rolled back. A fenced
run never commits again: if its query in fact still runs, it fails
at its next batch and must be restarted from its checkpoint (a new
run; nothing decided is lost). Without --force, recover already
resolves everything but the transactions of live runs (heard from
within their timeout, see sqlsink status); use --force for a run you
know is dead or stuck and do not want to wait for. A transaction the
fenced run prepared while recover ran is listed as left: run recover
again."""

CONNECT_FIX = (
    "check that the server is up, and the host, port, "
    "database and user of --url (and its password, or PGPASSWORD / ~/.pgpass on "
    "PostgreSQL, or --password-command)"
)

DocT = TypeVar("DocT", bound=Envelope)


@dataclass(frozen=True)
class Command(Generic[DocT]):
    """A subcommand. ``start`` adds the command's keys, empty, to the envelope, so that a
    failure part-way still prints a whole document; ``run`` does the work and fills them
    in, and returns the exit code."""

    start: Callable[[argparse.Namespace, Envelope], DocT]
    run: Callable[[argparse.Namespace, Output, DocT], int]


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


def _batch_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a batch id (0, 1, 2, ...)")
    return value


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
    _add_recover(sub)
    _add_status(sub)
    _add_check(sub)
    _add_forget(sub)
    _add_metrics(sub)
    return parser


def _add_common(p: argparse.ArgumentParser) -> None:
    _add_connection(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object on stdout (see the "
        "module documentation of sqlsink.cli for its shape)",
    )


def _add_connection(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("SQLSINK_URL"),
        help="URL of the sink's database: PostgreSQL (a URL or conninfo) or MariaDB/MySQL "
        "(mariadb://, mysql://) (default: $SQLSINK_URL). Prefer PGPASSWORD or ~/.pgpass "
        "(PostgreSQL) or --password-command to a password in the URL",
    )
    p.add_argument(
        "--password-command",
        default=os.environ.get("SQLSINK_PASSWORD_COMMAND") or None,
        metavar="COMMAND",
        help="a command (run without a shell) that prints the password on stdout, "
        "asked at connect and again if the server refuses the password, e.g. "
        "'vault kv get -field=password secret/pg' (default: $SQLSINK_PASSWORD_COMMAND)",
    )


def _add_recover(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "recover",
        help="commit or roll back the prepared transactions a sink left behind",
        description="Resolve the prepared transactions of a sink (or of every sink in the "
        "database) with the sink's own rule: a gid its batch's decision names is committed, "
        "any other gid of the sink is rolled back, but those of a batch whose decision "
        "was lost (Spark went past it: --checkpoint has commits/K, or a later commit or "
        "abort of the sink shows it), which --commit-lost K commits; transactions not "
        "provably the sink's "
        "(other applications, other sinks, other databases) are never touched, nor those "
        "of a live run (heard from within its timeout: the runs registry, not connected "
        "sessions), which its own commit finishes; --force --run-id RUN declares a run "
        "dead first.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    _add_common(p)
    p.add_argument(
        "--sink-id",
        type=_sink_id,
        help="the sink to recover (default: every "
        "sink with leftovers;\nwith --checkpoint: the sink bound to the checkpoint's "
        "query)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="the query's checkpoint directory: "
        "report how Spark's\noffsets/commits relate to the commit log; refuse if "
        "the sink\nis bound to another query. Read before anything is resolved:\n"
        "the prepared transactions of a batch it records as committed\nbut that has no "
        "decision are left (see --commit-lost)",
    )
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument(
        "--commit-lost",
        action="append",
        type=_batch_id,
        metavar="K",
        help="a batch whose decision was lost (a failover or a restore)\nwhile its "
        "transactions stayed prepared: decide it naming them,\nthen commit them (repeat "
        "for several). Refused unless Spark\nwent past K (--checkpoint has commits/K, or "
        "a later\ncommit or abort of the sink shows it), K is above the\nhighest decided "
        "batch, and its transactions are one\nattempt per partition of one run",
    )
    p.add_argument(
        "--mark-skipped",
        action="append",
        type=_batch_id,
        metavar="N",
        help="a batch Spark committed that had nothing for this sink\n(a foreachBatch "
        "function that did not hand it to the\nwriter): record it with an empty decision "
        "(repeat for\nseveral). Refused on the same terms as --commit-lost,\nand when N "
        "has prepared transactions",
    )
    p.add_argument(
        "--rollback-undecided",
        action="append",
        type=_batch_id,
        metavar="K",
        help="a batch above the highest decided one of a streaming\nsink that you know "
        "Spark did not commit (no commits/K):\nroll back its prepared transactions. Without "
        "a readable\ncheckpoint they are kept (Spark may have committed K and\nlost its "
        "decision); refused when a checkpoint read\nrecords K as committed",
    )
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument(
        "--run-id",
        action="append",
        metavar="RUN",
        help="with --force: a run of the sink to declare dead (repeat\nfor several); "
        "sqlsink status --sink-id ID lists the runs",
    )
    p.add_argument(
        "--lock-timeout",
        type=_duration,
        default=30.0,
        metavar="DURATION",
        help="how long to wait for the sink's lock, which a committer\nholds while it "
        "commits (default 30s)",
    )
    p.set_defaults(handler=Command(recover.start, recover.run), validate=_check_force(p))


def _check_force(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], None]:
    """--force and --run-id go together: --force fences exactly the runs named."""

    def check(args: argparse.Namespace) -> None:
        if args.force and not args.run_id:
            p.error(
                "--force needs --run-id RUN: the run(s) to declare dead (sqlsink status "
                "--sink-id ID lists the sink's runs); without --force, recover already "
                "resolves everything but the live runs' transactions"
            )
        if args.run_id and not args.force:
            p.error("--run-id names runs for --force to declare dead: add --force")
        both = set(args.commit_lost or []) & set(args.mark_skipped or [])
        if both:
            p.error(
                f"batch {min(both)} is named by both --commit-lost and --mark-skipped: a lost "
                "batch with prepared transactions is committed, one without is skipped"
            )

    return check


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="the commit log, open prepared transactions, warnings")
    _add_common(p)
    p.add_argument("--sink-id", type=_sink_id, help="only this sink (default: every sink)")
    p.add_argument(
        "--max-age",
        type=_duration,
        default=300.0,
        metavar="DURATION",
        help="warn about prepared transactions and unfinished decisions "
        "older than this (default 5min)",
    )
    p.add_argument(
        "--batches",
        type=_positive_int,
        default=5,
        metavar="N",
        help="how many recent batches to show per sink (default 5)",
    )
    p.set_defaults(handler=Command(status.start, status.run))


def _add_check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help="the server settings and privileges the sink needs")
    _add_common(p)
    p.add_argument(
        "--trigger-interval",
        type=_duration,
        metavar="DURATION",
        help="the query's trigger interval, to judge timeouts against",
    )
    p.add_argument(
        "--partitions",
        type=_positive_int,
        metavar="N",
        help="the partitions of a batch, to judge prepared-transaction slots and "
        "max_connections against",
    )
    p.set_defaults(handler=Command(check.start, check.run))


def _add_forget(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "forget",
        help="remove a retired sink's commit log (refused while anything of it is unfinished)",
    )
    _add_common(p)
    p.add_argument("--sink-id", type=_sink_id, required=True, help="the sink to forget")
    p.add_argument(
        "--lock-timeout",
        type=_duration,
        default=forget.LOCK_TIMEOUT_S,
        metavar="DURATION",
        help="how long to wait for the sink's lock, which a committer\nor a recover holds "
        f"while it works (default {forget.LOCK_TIMEOUT_S:.0f}s); still held then: refused "
        "(exit 1), nothing removed",
    )
    p.set_defaults(handler=Command(forget.start, forget.run))


def _add_metrics(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "metrics",
        help="serve the commit log's figures to Prometheus (needs sqlsink[metrics])",
        description="Serve each sink's batches and rows committed, last batch age, commit "
        "and write times, prepared, stranded and incomplete transactions and data loss in "
        "the Prometheus/OpenMetrics text format on http://HOST:PORT/metrics, read from the "
        "commit log at each scrape (docs/alerts.md lists the series).",
    )
    _add_connection(p)
    p.add_argument(
        "--listen",
        type=metrics.listen_address,
        default=metrics.listen_address(metrics.DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help=f"where to serve /metrics (default {metrics.DEFAULT_LISTEN}; port 0: any free one)",
    )
    p.add_argument(
        "--query-timeout",
        type=metrics.query_timeout,
        default=5.0,
        metavar="DURATION",
        help="statement_timeout of each query of a scrape (default 5s)",
    )
    p.add_argument("--once", action="store_true", help="print one exposition on stdout and exit")
    p.set_defaults(handler=Command(metrics.start, metrics.run), json=False)


# -- entry point --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (validate := getattr(args, "validate", None)) is not None:
        validate(args)
    out = Output(args.json, args.url, sys.stdout, sys.stderr)
    command: Command[Any] = args.handler
    doc: Envelope = new_envelope(args.command, out.shown_url if args.url else None)
    try:
        if not args.url:
            raise CliError("no database given", "pass --url URL or set SQLSINK_URL")
        doc = command.start(args, doc)
        code = command.run(args, out, doc)
    except KeyboardInterrupt:
        out.error("sqlsink: interrupted")
        return 130
    except BrokenPipeError:  # e.g. | head: stop quietly
        return _broken_pipe()
    except Exception as exc:
        code = _failed(out, doc, exc, args.url)
    doc["exit_code"] = code
    if out.json_mode:
        try:
            out.emit_json(doc)
        except BrokenPipeError:
            return _broken_pipe()
    return code


def _failed(out: Output, doc: Envelope, exc: Exception, url: str | None) -> int:
    """Say why the command stopped; a bug shows where, without secrets."""
    failure = _explain(exc, url)
    if failure is None:
        out.error("sqlsink: internal error (please report it):\n" + traceback.format_exc())
        doc["error"] = {"message": "internal error", "fix": None}
        return EXIT_ERROR
    message, fix, code = failure
    return fail(out, doc, message, fix, code)


def _explain(exc: Exception, url: str | None) -> tuple[str, str | None, int] | None:
    """(message, fix, exit code) of an expected failure; None for a bug. The database's
    errors come as the backend tells them apart (``Database.driver_error``)."""
    if isinstance(exc, CliError):
        return exc.message, exc.fix, exc.exit_code
    if isinstance(exc, DataLossError):
        return exc.message, None, EXIT_LOSS
    if isinstance(exc, TransientError):  # a lock's wait names its own fix, not a connect's
        return exc.message, None if "held_by" in exc.context else CONNECT_FIX, EXIT_ERROR
    if isinstance(exc, SqlsinkError):
        return exc.message, None, EXIT_ERROR
    try:
        database = open_database(url or "")
    except ConfigError:
        return None
    failed = database.driver_error(exc)
    if failed is None:
        return None
    diag = failed.diag
    if failed.fault is DriverFault.PRIVILEGE:
        message = diag if diag.startswith("permission denied") else f"permission denied: {diag}"
        fix = "connect as the sink's role (the owner of the sqlsink schema) or a superuser"
        if database.name != "PostgreSQL":  # no schema owner nor superuser there
            fix = (
                "connect as the sink's user (the one its queries connect as), or grant this "
                "user what the message names (ALL on `sqlsink`.* for the commit log)"
            )
        return message, fix, EXIT_ERROR
    if failed.fault is DriverFault.UNDEFINED_TABLE:
        message = f"the sqlsink commit log is incomplete: {diag}"
        return message, database.schema_fix, EXIT_ERROR
    if failed.fault in (DriverFault.CONNECTION, DriverFault.QUERY_CANCELED):
        message = f"lost the connection to {database.name}: {diag}"
        return message, "run the command again: recovery is idempotent", EXIT_ERROR
    return f"{database.name} error: {diag}", None, EXIT_ERROR


def _broken_pipe() -> int:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout at exit: let it go nowhere
    return EXIT_WARN
