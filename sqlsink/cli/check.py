"""``sqlsink check``: the server settings and privileges the sink needs.

The checks themselves are the database's (``AdminSession.run_checks``; PostgreSQL's
``sqlsink.postgres.survey.server_checks.run_checks``), for a database with
``Capability.SERVER_CHECKS``; this command prints their findings. It exits 2 when a
finding is an error (the sink cannot run there as this role), 1 on warnings.
"""

from __future__ import annotations

import argparse
from typing import cast

from sqlsink.backends import open_database
from sqlsink.cli.connect import identify, open_connection
from sqlsink.cli.contract import CheckDocument, Envelope, FindingJson, FindingLevel, NoticeLevel
from sqlsink.cli.output import EXIT_ERROR, EXIT_OK, EXIT_WARN, Notice, Output, header, table
from sqlsink.core.admin import CheckContext, Finding
from sqlsink.core.database import Capability, require


def start(args: argparse.Namespace, envelope: Envelope) -> CheckDocument:
    return {
        **envelope,
        "server_version": None,
        "trigger_interval_seconds": args.trigger_interval,
        "partitions": args.partitions,
        "findings": [],
    }


def run(args: argparse.Namespace, out: Output, doc: CheckDocument) -> int:
    database = open_database(args.url)
    require(database, Capability.SERVER_CHECKS, "sqlsink check")
    with open_connection(args.url, "check", args.password_command) as conn:
        me = identify(conn, doc)
        doc["server_version"] = me.server_version
        findings = conn.run_checks(CheckContext(args.trigger_interval, args.partitions))
    doc["findings"] = [_finding_json(f) for f in findings]
    # the top-level warnings say what made the exit code, as every command's do (issue 15)
    doc["warnings"] = [
        Notice(
            cast(NoticeLevel, f.level), f"{f.setting} = {f.value} ({f.source}): {f.message}", f.fix
        ).as_json()
        for f in findings
        if f.level in ("warning", "error")
    ]
    levels = {f.level for f in findings}
    code = EXIT_ERROR if "error" in levels else EXIT_WARN if "warning" in levels else EXIT_OK
    if not out.json_mode:
        header(out, "check", me, f", {database.name} {me.server_version}")
        _print_findings(out, findings)
        meaning = {
            0: "the server is ready for the sink",
            1: "warnings (see above)",
            2: "the sink cannot run here as it is (see the errors above)",
        }
        out.line()
        out.line(f"exit {code}: {meaning[code]}")
    return code


def _finding_json(f: Finding) -> FindingJson:
    return {
        "level": cast(FindingLevel, f.level),  # a str in Finding; the contract test checks it
        "setting": f.setting,
        "value": f.value,
        "source": f.source,
        "message": f.message,
        "fix": f.fix,
    }


def _print_findings(out: Output, findings: list[Finding]) -> None:
    """A table of the findings, each fix under its row."""
    out.line()
    rows = [[f.level.upper(), f.setting, f.value, f.source, f.message] for f in findings]
    lines = table(["LEVEL", "SETTING", "VALUE", "SOURCE", "MESSAGE"], rows)
    out.line(lines[0])
    for text, f in zip(lines[1:], findings, strict=True):
        out.line(text)
        if f.fix:
            out.line(f"    fix: {f.fix}")
