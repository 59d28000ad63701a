"""``sqlsink forget``: remove a retired sink's commit log, so that its sink id can be
used again. It refuses while anything of the sink is unfinished (prepared
transactions, incomplete batches, a live run): that is what the log is there to
complete. Exit 0: removed (a sink with no decided batch too); 1: refused (the sink's
lock still held after --lock-timeout among them, as recover refuses a sink); 2: errors
(an unknown sink among them, with the known sinks listed).
"""

from __future__ import annotations

import argparse

from sqlsink.cli.connect import identify, open_connection, require_schema
from sqlsink.cli.contract import Envelope, ForgetDocument
from sqlsink.cli.output import (
    EXIT_OK,
    EXIT_WARN,
    CliError,
    Notice,
    Output,
    header,
    lock_held_fix,
    lock_still_held,
)
from sqlsink.errors import ConfigError, TransientError

LOCK_TIMEOUT_S = 10.0


def start(args: argparse.Namespace, envelope: Envelope) -> ForgetDocument:
    return {
        **envelope,
        "sink_id": args.sink_id,
        "forgotten": False,
        "decisions": 0,
        "first_batch": None,
        "last_batch": None,
        "message": None,
        "replay_warning": None,
    }


def replay_warning(sink_id: str, last_batch: int | None, writer: str | None = None) -> str:
    """What forgetting cannot prevent: the log made a replay of the last batch write
    nothing, and the checkpoint that would replay it is not in the database. For a sink
    bound to a named batch load (``writer`` 'load'): the log made a re-run of that load
    write nothing."""
    if writer == "load":
        return (
            f"sink id {sink_id} belonged to a named batch load, and its log is what made a "
            "re-run of that load write nothing: now a re-run of the old load (a job "
            "retried, or run again after a crash) writes that load's rows again; use sink "
            f"id {sink_id} again only for data that is not in the table yet"
        )
    return (
        f"a query restarted from its old checkpoint replays its last batch ({last_batch}) "
        "against the now empty log, so that batch's rows are written again (its driver may "
        "have stopped after the decision and before Spark recorded the batch); write sink "
        f"id {sink_id} again only from a new checkpointLocation"
    )


def run(args: argparse.Namespace, out: Output, doc: ForgetDocument) -> int:
    with open_connection(args.url, "forget", args.password_command) as conn:
        me = identify(conn, doc)
        require_schema(conn, me)
        try:
            gone = conn.forget_sink(args.sink_id, args.lock_timeout)
        except ConfigError as exc:
            doc["message"] = exc.message
        except TransientError as exc:
            if "held_by" not in exc.context:  # not the sink lock's wait: a lost connection
                raise
            # a refusal, as recover's (exit 1), in this command's words: its --lock-timeout
            held_by = f"held by {exc.context['held_by']}"
            refused = lock_still_held(args.lock_timeout, held_by, "nothing was removed")
            fix = lock_held_fix("forget", conn.terms().end_session)
            doc["message"] = refused
            doc["warnings"] = [Notice("warning", refused, fix, args.sink_id).as_json()]
        else:
            if not gone.known:
                listed = ", ".join(gone.others) or "none"
                raise CliError(
                    f"unknown sink {args.sink_id} in database {me.database}: the commit log "
                    f"has nothing of it (known sinks: {listed}); nothing was removed",
                    "check --sink-id (the sinkId option, else the query id) and the database "
                    "in --url; sqlsink status lists the sinks",
                )
            doc["forgotten"] = True  # a sink with no decided batch too: its registration
            doc["decisions"] = gone.decisions
            doc["first_batch"] = gone.first_batch
            doc["last_batch"] = gone.last_batch
            if gone.decisions:
                doc["replay_warning"] = replay_warning(args.sink_id, gone.last_batch, gone.writer)
    code = EXIT_WARN if doc["message"] else EXIT_OK
    if not out.json_mode:
        header(out, "forget", me)
        if doc["message"]:
            out.line(f"refused: {doc['message']}")
            for fix in [w["fix"] for w in doc["warnings"] if w["fix"]]:
                out.line(f"fix: {fix}")
        elif doc["decisions"]:
            out.line(
                f"forgot sink {args.sink_id}: {doc['decisions']} decided batch(es), "
                f"{doc['first_batch']} to {doc['last_batch']}; the sink id can be used again"
            )
            out.line(f"warning: {doc['replay_warning']}")
        else:
            out.line(
                f"forgot sink {args.sink_id}: it had no decided batch (only its registration); "
                "the sink id can be used again"
            )
        out.line()
        out.line(f"exit {code}: {'refused, see above' if code else 'done'}")
    return code
