"""``sqlsink``: the on-call tool of the sink: recover, status, check, forget, metrics.

    sqlsink recover --url URL [--sink-id ID] [--checkpoint DIR] [--dry-run]
                    [--force --run-id RUN ...] [--lock-timeout 30s] [--json]
    sqlsink status  --url URL [--sink-id ID] [--max-age 5min] [--batches 5] [--json]
    sqlsink check   --url URL [--trigger-interval DURATION] [--json]
    sqlsink forget  --url URL --sink-id ID [--json]
    sqlsink metrics --url URL [--listen 127.0.0.1:9188] [--query-timeout 5s] [--once]

``--url`` defaults to the environment variable ``SQLSINK_URL``. Prefer a password in
``PGPASSWORD`` or ``~/.pgpass`` to one in the URL (the command line is visible to
other users); either way no password ever appears in the output.

``recover`` resolves prepared transactions with the sink's own committer
(``sqlsink.core.committer.Committer`` on ``PostgresBackend``): the same rule, under
the same lock. It leaves the transactions of live runs (the runs registry: heard from
within their timeout, not fenced; connected sessions are evidence only) and resolves
the rest; ``--force --run-id RUN`` first declares a run dead (see ``--help``).

Exit codes (every command)
--------------------------
0  nothing wrong; everything resolved
1  warnings, or something left to do (a dry run with actions, a live run's transactions
   left, a sink whose lock stayed held past --lock-timeout: recover and forget refuse it)
2  usage, connection, permission or configuration error (nothing, or not all, was done)
3  data loss: a decided transaction is neither prepared nor committed

JSON output (``--json``): one object on stdout whose shape, ``"version": 1``, is the
``TypedDict``s of ``sqlsink.cli.contract`` (checked by mypy, and against real output by
``tests/pg/test_cli_contract.py``); ``docs/reference/json.md`` documents it for users.

Human output goes to stdout; progress, notes and one-line errors go to stderr.

The modules: ``parser`` (arguments, ``main``, failures), ``output`` (printing, secret
scrubbing, exit codes), ``contract`` (the JSON), ``connect``, ``loss`` (data loss, as
both recover and status report it), and one module per command: ``recover`` (with
``recover_report`` and ``recover_checkpoint``), ``status`` (with ``status_report``),
``check``, ``forget``; ``runs`` shows a sink's runs for both recover and status.
"""

from __future__ import annotations

from sqlsink.cli.parser import main

__all__ = ["main"]
