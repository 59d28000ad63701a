"""``sqlsink status``'s pieces that need no connection: sorting the prepared transactions
into the sinks' and the others', which sinks to show, and the JSON of a decision, a
view and another application's prepared transaction (the contract in cli/contract.py)."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlsink.cli.contract import (
    BatchFiguresJson,
    ConsistentViewJson,
    LastBatchJson,
    OtherPreparedJson,
    RecentBatchJson,
)
from sqlsink.cli.output import CliError, Notice, format_age
from sqlsink.core.admin import ConsistentView, DecisionRow, ServerTerms, SinkRow
from sqlsink.core.gid import Gid
from sqlsink.core.model import BatchFigures, PreparedTransaction
from sqlsink.core.resolution import Scope, Why, sentence, whose

Ours = dict[str, list[tuple[PreparedTransaction, Gid]]]  # sink id -> its prepared gids here
Others = list[tuple[PreparedTransaction, Why]]  # with the reason it is not ours


def view_json(v: ConsistentView) -> ConsistentViewJson:
    return {"view": str(v.view), "table": v.table, "owner": v.owner}


def recent_json(d: DecisionRow) -> RecentBatchJson:
    return {
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
        "figures": None if d.figures is None else figures_json(d.figures),
    }


def figures_json(figures: BatchFigures) -> BatchFiguresJson:
    """The figures as the column holds them: ``BatchFigures.to_json`` is their one shape
    (``tests/pg/test_cli_contract.py`` checks it against ``BatchFiguresJson``)."""
    return cast(BatchFiguresJson, figures.to_json())


def last_batch_json(d: DecisionRow | None, commit_statement: str) -> LastBatchJson | None:
    """The sink's newest decision (``d``), with its figures and the line said from them
    (``commit_statement``: the database's name for the commits, ``ServerTerms``)."""
    if d is None:
        return None
    return {
        "batch_id": d.batch_id,
        "decided_at": d.decided_at,
        "line": (
            None if d.figures is None else d.figures.line(d.sink_id, d.batch_id, commit_statement)
        ),
        "figures": None if d.figures is None else figures_json(d.figures),
    }


def sort_prepared(
    prepared: list[PreparedTransaction], database: str, sink_id: str | None
) -> tuple[Ours, Others]:
    """Ours: sqlsink gids of this database (of --sink-id, if given); the others, why not
    (the resolution rule's ``whose``, as recover sorts them)."""
    ours: Ours = {}
    others: Others = []
    for txn in prepared:
        gid = Gid.parse(txn.gid)
        if (why := whose(txn, gid, database, sink_id)) is not None or gid is None:
            others.append((txn, why or Why.FOREIGN))
        else:
            ours.setdefault(gid.sink_id, []).append((txn, gid))
    return ours, others


def sink_names(
    rows: dict[str, SinkRow],
    ours: Ours,
    incomplete: list[DecisionRow],
    sink_id: str | None,
    database: str,
) -> set[str]:
    """The sinks to show: every one the database knows of, or --sink-id, which must exist."""
    names = set(rows) | set(ours) | {d.sink_id for d in incomplete}
    if sink_id is None:
        return names
    if sink_id not in names:
        listed = ", ".join(sorted(rows)[:20]) or "none"
        raise CliError(
            f"unknown sink {sink_id} in database {database} (known sinks: {listed})",
            "check --sink-id (the sinkId option, else the query id) and the database in --url",
        )
    return {sink_id}


def others_json(others: Others, now: datetime) -> list[OtherPreparedJson]:
    return [
        {
            "gid": txn.gid,
            "database": txn.database,
            "owner": txn.owner,
            "prepared_at": txn.prepared_at,
            "age_seconds": round((now - txn.prepared_at).total_seconds(), 3),
            "reason": sentence(why, txn, Gid.parse(txn.gid), Scope.everything()),
            "why": why.value,
        }
        for txn, why in others
    ]


def old_others_warning(
    others: list[OtherPreparedJson], max_age: float, database: str, terms: ServerTerms
) -> Notice | None:
    """Another application's old prepared transaction in this database."""
    old = [o for o in others if o["age_seconds"] > max_age and o["database"] == database]
    if not old:
        return None
    oldest = max(old, key=lambda o: o["age_seconds"])
    return Notice(
        "warning",
        f"{len(old)} prepared transaction(s) in this database that are not a "
        f"sink's are older than {format_age(max_age)} (oldest {oldest['gid']!r}, "
        f"{format_age(oldest['age_seconds'])}, role {oldest['owner']}): a prepared "
        f"transaction {terms.prepared_cost} until finished",
        "not sqlsink's to resolve: find the application that prepared it; as a last "
        f"resort {terms.rollback_example}, as {terms.finisher}",
    )
