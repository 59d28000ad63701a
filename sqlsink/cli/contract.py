"""The ``--json`` contract of ``sqlsink``: one ``TypedDict`` per document and object.

With ``--json`` every command prints exactly one object on stdout: a
``RecoverDocument``, ``StatusDocument`` or ``CheckDocument``. Each is the common
``Envelope`` plus the command's own keys. When a command fails before it starts (no
``--url``), only the ``Envelope`` is printed, with ``error`` set; any later failure
prints the whole document, ``error`` set, the keys it did not reach holding their
empty values (``[]``, ``None``), as ``start`` in each command module made them.

Versioning (``JSON_VERSION``, the ``version`` key): keys may be added under the same
version; renaming or removing a key, or changing its type, bumps the version.

Timestamps are ``datetime`` here and ISO-8601 strings in the JSON. Users' reference:
``docs/reference/json.md``; ``tests/pg/test_cli_contract.py`` checks real output against
these types.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypedDict

JSON_VERSION = 1

CommandName = Literal["recover", "status", "check", "forget"]
NoticeLevel = Literal["info", "warning", "error"]


# -- every command ------------------------------------------------------------------------


class NoticeJson(TypedDict):
    """An item of ``warnings``: something to look at, and what to do about it."""

    level: NoticeLevel
    sink_id: str | None  # the sink it is about, if one
    message: str
    fix: str | None


class ErrorJson(TypedDict):
    """Why the command stopped (exit 2 or 3): nothing, or not all, was done."""

    message: str
    fix: str | None


class Envelope(TypedDict):
    """The keys of every document, in this order, before the command's own."""

    version: int  # JSON_VERSION
    command: CommandName
    url: str | None  # --url with its password replaced by ***; null when none was given
    database: str | None  # null until connected
    role: str | None
    superuser: bool | None
    warnings: list[NoticeJson]
    error: ErrorJson | None
    exit_code: int  # the process's exit code: 0, 1, 2 or 3


class SessionJson(TypedDict):
    """A server session of the sink (a partition task, its committer, a lock holder)."""

    pid: int
    application_name: str
    user: str | None
    client: str | None  # the client's address; null for a local socket
    state: str | None  # pg_stat_activity.state
    backend_start: datetime | None


RunState = Literal["live", "dead", "fenced"]


class RunJson(TypedDict):
    """A run of a sink (one start of its streaming query, or one batch load), as the commit
    log's runs registry knows it. Live: not fenced, no batch aborted, and heard from (a
    task or a commit) within ``timeout_seconds``."""

    run_id: str
    state: RunState  # dead: heard from too long ago, or Spark aborted one of its batches
    first_seen: datetime
    heartbeat_at: datetime  # when a task or commit of the run was last heard from
    heartbeat_age_seconds: float
    timeout_seconds: float  # max(run_timeout_seconds, 3 x batch_interval_seconds)
    run_timeout_seconds: float  # the runTimeout option it runs with
    batch_interval_seconds: float | None  # longest of its last 3 gaps between decisions
    superseded_at: datetime | None  # fenced since
    superseded_by: str | None  # the newer run that fenced it, or "operator" (recover --force)
    aborted_batch: int | None  # Spark aborted its batches up to this one
    prepared: int  # its prepared transactions of the sink in this database
    # its query's end as its driver recorded it (null: none recorded); ``state`` stays the
    # registry's, which holds a stopped run live until its timeout
    ended: RunEndJson | None


class DataLossJson(TypedDict):
    """A decided transaction that is neither prepared nor committed: its rows are lost."""

    sink_id: str
    batch_id: int
    partition_id: int | None  # null when the gid does not parse
    gid: str


# -- recover ------------------------------------------------------------------------------

RecoverStatus = Literal["nothing to do", "planned", "recovered", "refused", "failed", "data loss"]
ActionName = Literal["commit", "rollback", "leave"]  # the values of core.resolution.Action
ActionResult = Literal["committed", "rolled back", "already finished"]
CheckpointDecision = Literal["complete", "incomplete", "none"]
CheckpointLevel = Literal["ok", "info", "warning"]


class RecoverSinkJson(TypedDict):
    """One sink that ``recover`` looked at."""

    sink_id: str
    bound_query_id: str | None  # the streaming query the sink is bound to
    live: bool  # a run of the sink is live (runs registry; see RunJson)
    lock: Literal["free", "held"]  # the sink's lock when recover tried to take it
    lock_holders: list[SessionJson]
    sessions: list[SessionJson]  # its connected tasks and committer: evidence only
    status: RecoverStatus
    message: str | None  # why refused, failed or data loss
    committed: int  # gids committed by this run
    rolled_back: int
    already_committed: int  # decided gids found already committed
    completed_batches: list[int]  # batches this run marked complete
    runs: list[RunJson]  # its live runs, runs with prepared transactions, runs fenced now
    live_runs: list[str]  # the runs treated as live: their undecided gids were left
    fenced_runs: list[str]  # the runs this command declared dead (--force --run-id)
    ended_sessions: list[int]  # pids of the fenced runs' sessions this command ended
    # batches this command decided (--commit-lost, --mark-skipped)
    decided_batches: list[int]
    # undecided batches Spark went past (its checkpoint, or the commit log's record): their
    # decision was lost, and their prepared transactions were left (--commit-lost commits them)
    lost_decision_batches: list[int]
    # the checkpoint whose commits/ was read (--checkpoint, or the one the sink's query
    # recorded, when readable here); null: none was read
    checkpoint_read: str | None
    # undecided batches above the highest decided one of a streaming sink whose prepared
    # transactions were left because no checkpoint was read (--rollback-undecided K)
    undecided_kept_batches: list[int]


class ActionJson(TypedDict):
    """A prepared transaction of the cluster and what recover did or would do with it.

    Every prepared transaction is listed: the sinks' (commit, rollback, or leave when
    not provably theirs) and everybody else's (leave)."""

    gid: str
    sink_id: str | None  # null: not a sqlsink gid
    batch_id: int | None
    partition_id: int | None
    run_id: str | None
    database: str
    owner: str
    prepared_at: datetime
    age_seconds: float
    action: ActionName
    reason: str  # for people; may be reworded
    why: str  # what to branch on: a value of sqlsink.core.resolution.Why (e.g. "live_run")
    done: bool  # committed or rolled back by this run
    result: ActionResult | None  # null for leave, and for what was not done


class CheckpointBatchJson(TypedDict):
    """How one batch of Spark's checkpoint relates to the commit log."""

    batch_id: int
    offsets: bool  # Spark planned it (offsets/N)
    spark_committed: bool  # Spark committed it (commits/N)
    decision: CheckpointDecision
    rows: int | None
    state: str  # a key of sqlsink.checkpoint.relation.STATES
    level: CheckpointLevel
    message: str


class CheckpointJson(TypedDict):
    """``recover --checkpoint``: the checkpoint beside the commit log."""

    path: str
    query_id: str
    sink_id: str
    bound_query_id: str | None
    last_offsets_batch: int | None
    last_committed_batch: int | None
    problems: list[str]  # unreadable checkpoint entries, ignored
    batches: list[CheckpointBatchJson]


class RecoverDocument(Envelope):
    dry_run: bool
    forced: bool
    run_ids: list[str]  # --run-id: the runs --force declares dead
    sinks: list[RecoverSinkJson]
    actions: list[ActionJson]
    data_loss: list[DataLossJson]
    checkpoint: CheckpointJson | None  # null without --checkpoint
    commit_lost: list[int]  # --commit-lost: batches to decide with their prepared transactions
    mark_skipped: list[int]  # --mark-skipped: batches to record without rows
    rollback_undecided: list[int]  # --rollback-undecided: batches named as not committed


# -- status -------------------------------------------------------------------------------


class PartitionWriteJson(TypedDict):
    """One partition's write in a batch's figures."""

    partition: int
    rows: int
    write_ms: float  # first write to PREPARE, on the partition's own clock


class BatchFiguresJson(TypedDict):
    """A batch's figures as its commit recorded them (``sqlsink.decisions.figures``,
    ``core.model.BatchFigures``); times in milliseconds."""

    partitions: int  # partitions that wrote (prepared, or committed directly at at-least-once)
    rows: int
    bytes_sent: int | None  # null unless every partition counted the bytes it sent
    writes: list[PartitionWriteJson]  # by partition
    slowest_partition: int | None
    slowest_write_ms: float | None
    prepare_to_decision_ms: float | None  # the last partition's PREPARE to the decision written
    decision_ms: float  # the decision's write
    commit_prepared_ms: float  # the COMMIT PREPAREDs (MariaDB: the XA COMMITs)
    completion_ms: float  # the rest: reading, orphans' rollbacks, marking it complete
    commit_ms: float  # commit_prepared_ms + completion_ms
    orphans: int
    dead_letters: int  # rows written to the dead-letter table instead (deadLetterTable)


class LastBatchJson(TypedDict):
    """The sink's newest decision and its figures."""

    batch_id: int
    decided_at: datetime
    line: str | None  # the driver's per-batch log line, said from the figures
    figures: BatchFiguresJson | None  # null: not recorded (its commit is not done, or older)


class RecentBatchJson(TypedDict):
    """A recent decision of the sink, newest first."""

    batch_id: int
    rows: int
    gids: int  # how many partition transactions the decision names
    decided_at: datetime
    completed_at: datetime | None  # null: some of its gids are not committed yet
    query_id: str | None
    run_id: str | None
    rows_per_second: float | None
    lag_seconds: float | None  # from the batch's first write until it was complete
    commit_ms: float | None
    orphans: int | None
    figures: BatchFiguresJson | None  # null before schema version 9, or not recorded


class PreparedJson(TypedDict):
    """An open prepared transaction of the sink, in this database."""

    gid: str
    batch_id: int
    partition_id: int
    run_id: str
    database: str
    owner: str
    prepared_at: datetime
    age_seconds: float
    decided: bool  # its batch's decision names it: recover commits it
    stranded: bool  # its run is not live (or its batch was aborted): nobody else finishes it


class StatusSinkJson(TypedDict):
    sink_id: str
    bound_query_id: str | None
    # the tables of its newest decision that names them (schema 8 on; [] before): what
    # the sink writes, one table or several (the foreachBatch writer)
    tables: list[str]
    bound_at: datetime | None
    decisions: int
    last_decided_batch: int | None
    last_complete_batch: int | None
    incomplete_batches: list[int]
    recent_batches: list[RecentBatchJson]
    last_batch: LastBatchJson | None  # null: no decision yet
    prepared: list[PreparedJson]
    live: bool  # a run of the sink is live (runs registry; see RunJson)
    sessions: list[SessionJson]  # its connected tasks and committer: evidence only
    lock_holders: list[SessionJson]
    runs: list[RunJson]  # live runs, runs with prepared transactions, the newest 3
    checkpoint_check: CheckpointCheckJson | None  # the newest run's; None: not checked yet
    consistent_views: list[ConsistentViewJson]  # the sink's views (option consistentView)
    hidden_batches: list[HiddenBatchJson]  # what those views hide right now, and why
    # nothing but its registration: no decision, nothing prepared, no run live, no session
    # (a one-off load that failed before its decision); the report counts it apart
    never_wrote: bool
    # what status concludes of the sink's newest run, and what it rests on
    state: SinkState | None  # null: no run known, none live, ended or stranded
    ended: RunEndJson | None  # the newest run's end, as its driver recorded it
    in_doubt: InDoubtJson | None  # a live run that may be gone: what is known


SinkState = Literal["live", "quiet", "stopped", "failed", "stranded"]


class RunEndJson(TypedDict):
    """How a run ended, recorded by its driver's listener when its query terminated
    (schema version 10; spark/listener.py)."""

    run_id: str
    ended_at: datetime
    how: Literal["stopped", "failed"]
    error: str | None  # failed: the error's first line (bounded, secrets scrubbed)


class InDoubtJson(TypedDict):
    """A run the registry still holds live (heard from within its timeout) that left
    batches decided, not complete (committed in part or not yet at all) with no session of
    the sink connected: its driver may be gone (killed). What is known, and when it is
    declared dead."""

    run_id: str
    heard_at: datetime  # last heard from (a task, a commit, a heartbeat)
    heard_age_seconds: float
    sessions: int  # sessions of the sink connected: 0
    partial_batches: list[int]  # decided, not complete: some partitions still prepared
    dead_at: datetime  # heard_at + its timeout: then recover finishes those batches
    dead_in_seconds: float


class ConsistentViewJson(TypedDict):
    """A consistent view of the sink (option consistentView), known by its comment."""

    view: str  # schema.name
    table: str  # the table it shows, quoted ("schema"."name")
    owner: str  # the role that owns it: readers read with its rights


class HiddenBatchJson(TypedDict):
    """A batch of the sink committed in part: the bare table shows these partitions, a
    consistent view hides them until the batch is complete (docs/DESIGN.md invariant 13)."""

    batch_id: int
    partitions_hidden: int  # committed partitions (their markers are visible)
    rows_hidden: int
    partitions: int | None  # the partitions its decision names; null: no decision left
    prepared: int  # of those, still prepared: their COMMIT PREPARED (XA COMMIT) is awaited
    reason: str  # why it is not complete, and what finishes it


class CheckpointCheckJson(TypedDict):
    """The checkpoint checked against the commit log at a run's first commit (invariant 9)."""

    run_id: str
    verdict: str  # verified | loss | unverified | off
    detail: str
    lost: list[int]  # batches Spark's checkpoint records as committed that the log lacks
    location: str | None  # without secrets
    batch_id: int | None  # the commit that checked
    checked_at: datetime


class OtherPreparedJson(TypedDict):
    """A prepared transaction that is not this tool's to resolve here."""

    gid: str
    database: str
    owner: str
    prepared_at: datetime
    age_seconds: float
    reason: str  # for people, e.g. "not a sqlsink transaction", "belongs to sink b"
    why: str  # what to branch on: "foreign", "other_sink" or "other_database" (resolution.Why)


class StatusDocument(Envelope):
    server_time: datetime | None  # null only when error is set
    max_age_seconds: float
    sinks: list[StatusSinkJson]
    other_prepared: list[OtherPreparedJson]
    data_loss: list[DataLossJson]


# -- check --------------------------------------------------------------------------------


FindingLevel = Literal["ok", "info", "warning", "error"]


class FindingJson(TypedDict):
    """One verdict on one server setting or privilege."""

    level: FindingLevel
    setting: str
    value: str | None
    source: str | None  # where the value comes from
    message: str
    fix: str | None  # the statement to run


class CheckDocument(Envelope):
    server_version: str | None  # null only when error is set
    trigger_interval_seconds: float | None
    partitions: int | None  # --partitions (added in version 1: an added field)
    findings: list[FindingJson]


class ForgetDocument(Envelope):
    sink_id: str
    forgotten: bool  # the sink's log was removed (false: refused, or nothing to remove)
    decisions: int  # decisions removed
    first_batch: int | None
    last_batch: int | None
    # why it was refused (exit 1): unfinished transactions, a live run, or the sink's lock
    # still held after `--lock-timeout` (then `warnings` holds the refusal with its fix)
    message: str | None
    # once forgotten: what a query restarted from its old checkpoint would do (it replays
    # its last batch against the empty log, writing its rows again); for a named batch
    # load's sink, what a re-run of that load would do (write its rows again)
    replay_warning: str | None


# What ``--json`` prints: a command's document, or (error set) only the envelope.
Document = RecoverDocument | StatusDocument | CheckDocument | ForgetDocument | Envelope
