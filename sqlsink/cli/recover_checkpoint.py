"""``recover --checkpoint``: Spark's checkpoint beside the sink's commit log.

Without ``--sink-id`` the checkpoint names the sink: the one bound to its query. It must
belong to the query the sink is bound to, and is related batch by batch to the commit log
(``sqlsink.checkpoint.relation.relate``), for the report.
"""

from __future__ import annotations

from typing import cast

from sqlsink.checkpoint.parse import Checkpoint
from sqlsink.checkpoint.relation import BatchRelation, DecisionState, relate
from sqlsink.cli.contract import (
    CheckpointBatchJson,
    CheckpointDecision,
    CheckpointJson,
    CheckpointLevel,
)
from sqlsink.cli.output import CliError, Notice, Output
from sqlsink.core.admin import AdminSession, RoleInfo, SinkRow
from sqlsink.core.gid import Gid


def sink_of_checkpoint(
    conn: AdminSession,
    checkpoint: Checkpoint,
    bound: dict[str, SinkRow],
    database: str,
) -> str:
    """The sink the checkpoint's query writes (``--checkpoint`` without ``--sink-id``): the
    one the commit log binds to that query; else a sink whose id is the query id (a query
    without the ``sinkId`` option) that is not bound yet (no decision) but registered a run
    or prepared a transaction. The query id is never taken as the id of a sink the log does
    not know. None or several: a refusal that names the sinks."""
    query = checkpoint.query_id
    writes = sorted(s for s, row in bound.items() if row.query_id == query)
    if len(writes) == 1:
        return writes[0]
    if len(writes) > 1:
        names = ", ".join(writes)
        raise CliError(
            f"query {query} (checkpoint {checkpoint.path}) writes {len(writes)} sinks in "
            f"database {database}: {names}; nothing was done",
            f"name one: --sink-id ID --checkpoint {checkpoint.path} (ID one of {names})",
        )
    row = bound.get(query)
    if row is not None and row.query_id is None:
        binding = conn.binding(query)
        if binding is not None and binding.kind == "unknown":  # registered, not yet bound
            return query
    elif row is None and _prepared_here(conn, query):
        return query
    raise CliError(
        f"no sink in database {database} is bound to query {query}, the query of checkpoint "
        f"{checkpoint.path} (the sinks it knows: {known_sinks(conn, bound)}); nothing was done",
        "name the sink: --sink-id ID beside --checkpoint (the query's sinkId option, else its "
        "query id), and check that --url names the sink's database",
    )


def known_sinks(conn: AdminSession, bound: dict[str, SinkRow], most: int = 20) -> str:
    """The sinks of the commit log, each with what it is bound to (at most ``most``)."""
    shown = []
    for sink_id, row in list(bound.items())[:most]:
        if row.query_id is not None:
            shown.append(f"{sink_id} (query {row.query_id})")
        else:
            binding = conn.binding(sink_id)
            kind = binding.kind if binding is not None else "unknown"
            shown.append(f"{sink_id} ({'a batch load' if kind == 'load' else 'not bound yet'})")
    more = f" and {len(bound) - most} more (sqlsink status lists them)" if len(bound) > most else ""
    return (", ".join(shown) or "none") + more


def check_checkpoint_binding(
    conn: AdminSession,
    checkpoint: Checkpoint,
    sink_id: str,
    bound: dict[str, SinkRow],
    me: RoleInfo,
) -> None:
    """Refuse a checkpoint of another query than the one the sink is bound to, and one
    given for a sink bound to a batch load (no query: no checkpoint is its)."""
    row = bound.get(sink_id)
    if row is None or row.query_id == checkpoint.query_id:
        return
    if row.query_id is not None:
        holder = f"streaming query {row.query_id}"
    else:
        binding = conn.binding(sink_id)
        if binding is None or binding.kind != "load":
            return  # not bound yet: its first decision binds it
        holder = binding.describe()
    raise CliError(
        f"sink {sink_id} (database {me.database}) is bound to {holder}, "
        f"but checkpoint {checkpoint.path} belongs to query {checkpoint.query_id}: this "
        "checkpoint and this sink do not belong together, so nothing was done",
        "pass the checkpoint of the query that writes this sink, or the sink id that this "
        "query uses (--sink-id); a new query reusing the sink id is refused by the sink too",
    )


def relate_checkpoint(
    conn: AdminSession,
    checkpoint: Checkpoint,
    sink_id: str,
    bound: dict[str, SinkRow],
    warnings: list[Notice],
) -> CheckpointJson:
    """Each batch of the checkpoint against the commit log; its problems as warnings."""
    known = set(checkpoint.offsets) | checkpoint.commits
    oldest = min(known) if known else 0
    decisions = conn.decisions_from(sink_id, oldest)
    summary = conn.batch_summary(sink_id)
    prepared = _prepared_here(conn, sink_id)
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
        checkpoint,
        states,
        undecided_prepared=undecided,
        first_decided=summary.first_decided,
        sink_id=sink_id,
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
        "batches": [_batch_json(r) for r in relations],
    }


def _prepared_here(conn: AdminSession, sink_id: str) -> dict[str, Gid]:
    """The sink's prepared gids in this database."""
    database = conn.database()
    prepared: dict[str, Gid] = {}
    for txn in conn.all_prepared():
        gid = Gid.parse(txn.gid)
        if gid is not None and gid.sink_id == sink_id and txn.database == database:
            prepared[txn.gid] = gid
    return prepared


def _batch_json(r: BatchRelation) -> CheckpointBatchJson:
    # BatchRelation types decision and level as str; the contract test checks the values
    return {
        "batch_id": r.batch_id,
        "offsets": r.offsets,
        "spark_committed": r.spark_committed,
        "decision": cast(CheckpointDecision, r.decision),
        "rows": r.rows,
        "state": r.state,
        "level": cast(CheckpointLevel, r.level),
        "message": r.message,
    }


def print_checkpoint(out: Output, doc: CheckpointJson) -> None:
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
        if b["state"] != "consistent":
            mark = "!" if b["level"] == "warning" else " "
            out.line(f"{mark} {b['message']}")
            i += 1
            continue
        j = _end_of_consistent_run(batches, i)
        if j > i:
            out.line(
                f"  batches {b['batch_id']}-{batches[j]['batch_id']}: committed in Spark "
                "and in the database"
            )
        else:
            out.line(f"  {b['message']}")
        i = j + 1
    if not batches:
        out.line("  the checkpoint holds no batches yet, and the sink no decisions")


def _end_of_consistent_run(batches: list[CheckpointBatchJson], i: int) -> int:
    """The last index of the run of consecutive consistent batches that starts at i."""
    j = i
    while (
        j + 1 < len(batches)
        and batches[j + 1]["state"] == "consistent"
        and batches[j + 1]["batch_id"] == batches[j]["batch_id"] + 1
    ):
        j += 1
    return j
