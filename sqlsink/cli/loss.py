"""Data loss as ``recover`` and ``status`` report it: found, said and shown the same way.

A loss is a decided gid that is neither prepared nor committed (its marker row is not
visible): someone rolled it back, and its rows are missing.
"""

from __future__ import annotations

from sqlsink.cli.contract import DataLossJson
from sqlsink.cli.output import Output, table
from sqlsink.core.admin import AdminSession
from sqlsink.core.gid import Gid
from sqlsink.core.resolution import Plan
from sqlsink.core.resolver import data_loss_error

LOSS_FIX = (
    "see the runbook's 'Data loss' (docs/operations/runbook.md); the decision stays incomplete, so "
    "status and recover report it until it is dealt with"
)


def confirmed_losses(conn: AdminSession, plan: Plan) -> list[tuple[int, str]]:
    """The plan's decided gids gone without their marker: (batch, gid). Read-only, and
    confirmed by a second read."""
    candidates = {gid for _, gid in plan.to_verify}
    gone = candidates - conn.visible_markers(candidates)
    lost = conn.confirm_lost(gone)
    return [(batch, gid) for batch, gid in plan.to_verify if gid in lost]


def loss_message(lost: list[tuple[int, str]]) -> str:
    """The sink's own data-loss message (each lost batch, partition and gid; the runbook)."""
    return data_loss_error(lost).message


def loss_json(sink_id: str, batch_id: int, gid: str) -> DataLossJson:
    parsed = Gid.parse(gid)
    return {
        "sink_id": sink_id,
        "batch_id": batch_id,
        "partition_id": parsed.partition_id if parsed else None,
        "gid": gid,
    }


def print_losses(out: Output, heading: str, lost: list[tuple[str, int, str]]) -> None:
    """A table of (sink, batch, gid) under a heading; nothing when there is no loss."""
    if not lost:
        return
    out.line()
    out.line(heading)
    rows = [[s, b, (p.partition_id if (p := Gid.parse(g)) else "?"), g] for s, b, g in lost]
    for text in table(["SINK", "BATCH", "PARTITION", "GID"], rows, right={1, 2}):
        out.line("  " + text)
