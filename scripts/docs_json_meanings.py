"""What each key of ``sqlsink --json`` means, for docs/reference/json.md (scripts/gen_docs.py).

Keyed ``TypedDictName.key`` of ``sqlsink/cli/contract.py``; a key not here is documented
by its comment in contract.py, or by its name and type alone (``gid``, ``pid``). The keys
and their types always come from contract.py; tests/docs/test_generated.py fails when a
meaning here names a key the contract no longer has.
"""

MEANINGS: dict[str, str] = {
    "ActionJson.batch_id": ("parsed from the gid; null when it is not a sqlsink gid"),
    "ActionJson.database": ("the database it was prepared in"),
    "ActionJson.done": ("committed or rolled back by this run"),
    "ActionJson.gid": ("the transaction's global id"),
    "ActionJson.owner": ("the role that prepared it"),
    "ActionJson.partition_id": ("parsed from the gid; null when it is not a sqlsink gid"),
    "ActionJson.reason": (
        'for people, and may be reworded: e.g. `"batch 4 is decided"`, `"not a sqlsink '
        'transaction"`'
    ),
    "ActionJson.result": ("null for `leave`, and for what was not done"),
    "ActionJson.run_id": ("parsed from the gid; null when it is not a sqlsink gid"),
    "ActionJson.sink_id": ("parsed from the gid; null when it is not a sqlsink gid"),
    "BatchFiguresJson.bytes_sent": ("null unless every such partition counted what it sent"),
    "BatchFiguresJson.commit_ms": ("the last two together"),
    "BatchFiguresJson.commit_prepared_ms": ("the COMMIT PREPAREDs (MariaDB: the XA COMMITs)"),
    "BatchFiguresJson.completion_ms": (
        "the rest of the commit: reading the prepared transactions and decisions, rolling "
        "back orphans, marking the batch complete"
    ),
    "BatchFiguresJson.decision_ms": ("the decision's write"),
    "BatchFiguresJson.orphans": ("orphans rolled back by the commit"),
    "BatchFiguresJson.partitions": (
        "partitions that wrote: prepared a transaction, or committed directly at `at_least_once`"
    ),
    "BatchFiguresJson.prepare_to_decision_ms": (
        "the last partition's PREPARE to the decision written, Spark's hand-over included; "
        "the two clocks may differ on a cluster"
    ),
    "BatchFiguresJson.writes": (
        "each partition's rows and its time from first write to PREPARE, on its own clock"
    ),
    "CheckDocument.partitions": (
        "`--partitions`: the partitions of a batch, judged against "
        "`max_prepared_transactions` and `max_connections`"
    ),
    "CheckDocument.server_version": ("null only when `error` is set"),
    "CheckDocument.trigger_interval_seconds": ("`--trigger-interval`"),
    "CheckpointBatchJson.offsets": ("Spark planned it"),
    "CheckpointBatchJson.state": (
        'one of `sqlsink.checkpoint.STATES`, e.g. `"consistent"`, `"replay_skip"`, `"rerun"`'
    ),
    "CheckpointCheckJson.batch_id": ("the commit that checked"),
    "CheckpointCheckJson.lost": (
        "batches Spark's checkpoint records as committed that the commit log lacks; with "
        "`loss`, `status` exits 3"
    ),
    "CheckpointCheckJson.verdict": ("`verified`, `loss`, `unverified`, `off`"),
    "CheckpointJson.problems": ("unreadable entries, ignored"),
    "CheckpointJson.query_id": ("the checkpoint's"),
    "ConsistentViewJson.owner": ("the role that owns it; readers read with its rights"),
    "ConsistentViewJson.table": ('the table it shows, quoted as `"schema"."name"`'),
    "ConsistentViewJson.view": ("`schema.name`"),
    "Envelope.database": ("the database connected to; null if not connected"),
    "Envelope.error": ("why the command stopped"),
    "Envelope.exit_code": ("as above"),
    "Envelope.role": ("the role connected as"),
    "Envelope.superuser": ("whether that role is a superuser"),
    "Envelope.url": (
        "`--url` (or `SQLSINK_URL`), password replaced by `***`; null when none was given"
    ),
    "Envelope.version": ("`1`"),
    "Envelope.warnings": ("what to look at, worst first in the human report"),
    "FindingJson.fix": ("the statement to run"),
    "FindingJson.setting": (
        'a server setting or a check, e.g. `"max_prepared_transactions"`, `"sqlsink privileges"`'
    ),
    "FindingJson.source": ("where the value comes from"),
    "HiddenBatchJson.partitions": (
        "the partitions its decision names; null when it has none any more"
    ),
    "HiddenBatchJson.partitions_hidden": ("committed partitions, whose markers are visible"),
    "HiddenBatchJson.prepared": ("of those, still prepared"),
    "HiddenBatchJson.reason": (
        "why the batch is not complete and what finishes it: partitions still prepared; none "
        "prepared and not all committed, i.e. its commit is finishing or a partition was "
        "lost; or a complete batch whose markers were kept, which `status` also warns about "
        "when the sink has a view"
    ),
    "LastBatchJson.line": ("the driver's per-batch log line, said from the figures"),
    "NoticeJson.fix": ("what to do"),
    "NoticeJson.sink_id": ("the sink it is about"),
    "OtherPreparedJson.reason": (
        'e.g. `"not a sqlsink transaction"`, `"belongs to sink b"`, `"in database other"`'
    ),
    "OtherPreparedJson.why": ("what to branch on"),
    "PreparedJson.decided": ("its batch's decision names it, so recover commits it"),
    "PreparedJson.stranded": (
        "its run is not live, or unknown to the commit log: nobody but `recover` or a new run"
        " of the query finishes it; `status` then warns with the command to run"
    ),
    "RecentBatchJson.completed_at": ("null while not complete"),
    "RecentBatchJson.figures": (
        "null for decisions made before schema version 9, and until the batch's commit has run"
    ),
    "RecentBatchJson.gids": ("partition transactions"),
    "RecentBatchJson.lag_seconds": ("from the batch's first write until it was complete"),
    "RecoverDocument.actions": (
        "every prepared transaction of the cluster, and what was done with it"
    ),
    "RecoverDocument.checkpoint": ("with `--checkpoint` only"),
    "RecoverDocument.commit_lost": (
        "`--commit-lost`: batches to decide with their prepared transactions"
    ),
    "RecoverDocument.dry_run": ("`--dry-run`: nothing was changed"),
    "RecoverDocument.forced": ("`--force`"),
    "RecoverDocument.mark_skipped": ("`--mark-skipped`: batches to record as batches without rows"),
    "RecoverDocument.rollback_undecided": (
        "`--rollback-undecided`: batches the operator names as not committed by Spark; their "
        "undecided prepared transactions are rolled back"
    ),
    "RecoverDocument.run_ids": ("`--run-id`: the runs `--force` declares dead"),
    "RecoverDocument.sinks": ("the sinks looked at (`--sink-id`, or every sink with leftovers)"),
    "RecoverSinkJson.already_committed": ("decided gids found already committed"),
    "RecoverSinkJson.bound_query_id": ("the streaming query the sink is bound to"),
    "RecoverSinkJson.checkpoint_read": (
        "the checkpoint whose `commits/` this command read: `--checkpoint`, else the one the "
        "sink's query recorded when readable here; null when none was read"
    ),
    "RecoverSinkJson.committed": ("gids of this sink committed by this run"),
    "RecoverSinkJson.completed_batches": ("batches this run marked complete"),
    "RecoverSinkJson.decided_batches": (
        "batches this run decided (`--commit-lost`, `--mark-skipped`)"
    ),
    "RecoverSinkJson.ended_sessions": (
        "pids of sessions ended because they provably belonged to a fenced run (they held the"
        " sink's lock)"
    ),
    "RecoverSinkJson.fenced_runs": (
        "the runs this command declared dead (`--force --run-id`); one already fenced is not listed"
    ),
    "RecoverSinkJson.live": (
        "a run of the sink is live (see RUN); a connected session or a held lock is not enough"
    ),
    "RecoverSinkJson.live_runs": (
        "the runs treated as live: their undecided transactions were left for their own commit"
    ),
    "RecoverSinkJson.lock": ("the sink's lock when recover tried to take it"),
    "RecoverSinkJson.lost_decision_batches": (
        "undecided batches that Spark went past (its checkpoint, or the commit log's record "
        "of a later batch): their decision was lost, and their prepared transactions were "
        "left for `--commit-lost`"
    ),
    "RecoverSinkJson.message": ("why refused, failed, or the data loss"),
    "RecoverSinkJson.rolled_back": ("gids of this sink rolled back by this run"),
    "RecoverSinkJson.runs": (
        "its live runs, the runs with prepared transactions, and the runs named by `--run-id`"
    ),
    "RecoverSinkJson.sessions": ("the sink's connected tasks and committer (evidence only)"),
    "RecoverSinkJson.status": (
        "`planned`: a dry run with something to do; `refused`: its lock stayed held for "
        "`--lock-timeout` (nothing was done for the sink; `--commit-lost` and "
        "`--mark-skipped` decided nothing)"
    ),
    "RecoverSinkJson.undecided_kept_batches": (
        "undecided batches above the highest decided one of a sink bound to a streaming "
        "query, left prepared because no checkpoint was read (Spark may have committed them);"
        " see `--rollback-undecided`"
    ),
    "RunJson.aborted_batch": ("Spark aborted the run's batches up to this one"),
    "RunJson.batch_interval_seconds": (
        "the longest of the last three gaps between the run's decisions; null before its second"
    ),
    "RunJson.heartbeat_at": ("when a task or commit of the run was last heard from"),
    "RunJson.prepared": ("its prepared transactions of the sink in this database"),
    "RunJson.run_id": ("Spark's run id (a fresh id per batch load)"),
    "RunJson.run_timeout_seconds": ("the run's `runTimeout` option"),
    "RunJson.state": (
        "live: not fenced, no batch of it aborted, heard from within `timeout_seconds`; dead:"
        " heard from too long ago, or Spark aborted one of its batches (the query failed or "
        "stopped); fenced: superseded by a newer run or by an operator"
    ),
    "RunJson.superseded_at": ("fenced since"),
    "RunJson.superseded_by": ('the newer run that fenced it, or `"operator"` (`recover --force`)'),
    "RunJson.timeout_seconds": (
        "the larger of `run_timeout_seconds` and 3 × `batch_interval_seconds`"
    ),
    "SessionJson.client": ("its address, null for a local socket"),
    "SessionJson.state": ("`pg_stat_activity.state`"),
    "StatusDocument.max_age_seconds": ("`--max-age`"),
    "StatusDocument.other_prepared": (
        "prepared transactions that are not this tool's to resolve here"
    ),
    "StatusDocument.server_time": ("the server's clock; null only when `error` is set"),
    "StatusDocument.sinks": ("every sink of the database, or `--sink-id`"),
    "StatusSinkJson.checkpoint_check": (
        "the newest run's checkpoint check; null: not checked yet (or schema below 4)"
    ),
    "StatusSinkJson.consistent_views": (
        "the sink's consistent views (option `consistentView`), known by their comment"
    ),
    "StatusSinkJson.decisions": ("decisions in the commit log"),
    "StatusSinkJson.hidden_batches": (
        "the sink's batches committed in part right now: the bare table shows these "
        "partitions, its consistent views hide them (empty below schema 5)"
    ),
    "StatusSinkJson.incomplete_batches": ("decided, some gids not committed (or unverified) yet"),
    "StatusSinkJson.last_batch": ("the newest decision and its figures; null: no decision yet"),
    "StatusSinkJson.live": ("a run of the sink is live (see RUN)"),
    "StatusSinkJson.never_wrote": (
        "nothing but its registration: no decision, nothing prepared, no run live, no "
        "session connected (a one-off batch load that failed before its decision); the "
        "human report counts such sinks in a line of their own, `registered, never wrote: "
        "N (ids)`, with the `sqlsink forget` that removes them, instead of a row of its "
        "table (with `--sink-id`, shown as any sink)"
    ),
    "StatusSinkJson.prepared": ("the sink's open prepared transactions in this database"),
    "StatusSinkJson.state": (
        "status's verdict on the sink's newest run. `stopped` / `failed`: its driver "
        "recorded the end when the query stopped or failed (see RUN_END); `live`: a run is "
        "live and heard from as its batches suggest; `quiet`: a run is live by the registry "
        "but not heard from for longer than its batches suggest (twice its batch interval "
        "plus 5 s; a third of its timeout before an interval is known), or it is in doubt "
        "(see IN_DOUBT); `stranded`: no run is live and prepared transactions are left; "
        "null: no run known"
    ),
    "StatusSinkJson.ended": (
        "the newest run's end as its driver recorded it; null: not recorded (running, "
        "killed, Spark Connect, or schema below 10)"
    ),
    "StatusSinkJson.in_doubt": (
        "a run the registry holds live (heard from within its timeout) while batches of it "
        "are decided and not complete and no session of the sink is connected, read after "
        "the decisions: its driver may be gone. `status` then warns (exit 1, never all "
        "well), names the batches, when the run is declared dead, and the `sqlsink recover "
        "--force --run-id` that finishes them now"
    ),
    "RunEndJson.error": (
        "with `failed`, the error's first line: the last `Name: message` line of the "
        "Python traceback Spark wraps, else its first line; at most 300 characters, the "
        "connection's secrets replaced by `***`. Written by the listener sqlsink installs "
        "on the driver (classic PySpark 3.5 and 4.x, both entry points; not on Spark "
        "Connect, where a listener runs on the server or the client without the sink's "
        "options); a killed driver records nothing. A run's liveness (`live`, what "
        "`recover` acts on) stays the registry's"
    ),
    "StatusSinkJson.recent_batches": ("newest first, `--batches` of them"),
    "StatusSinkJson.runs": (
        "its live runs, the runs with prepared transactions, and its three newest runs"
    ),
    "StatusSinkJson.sessions": ("its connected tasks and committer (evidence only)"),
    "StatusSinkJson.tables": (
        "the tables (`schema.name`) its newest decision names: what the sink writes; `[]` for"
        " decisions made before schema version 8"
    ),
    "Envelope.command": ("the command that printed it"),
    "SessionJson.backend_start": ("when the session started"),
    "RunJson.first_seen": ("when the run was first registered"),
    "ActionJson.action": ("what recover does (or would do, `--dry-run`) with it"),
    "CheckpointBatchJson.decision": (
        "the commit log's decision of the batch: complete, not complete yet, or none"
    ),
    "CheckpointBatchJson.level": ("how much it matters"),
    "CheckpointBatchJson.message": ("what it means and what happens next"),
    "CheckpointJson.last_offsets_batch": ("the newest batch of Spark's `offsets/`"),
    "CheckpointJson.last_committed_batch": ("the newest batch of Spark's `commits/`"),
    "CheckDocument.findings": ("every verdict on the server's settings and the role's privileges"),
    "FindingJson.message": ("the verdict, in words"),
    "ForgetDocument.first_batch": ("the oldest of the decisions removed"),
    "ForgetDocument.last_batch": ("the newest of the decisions removed"),
    "HiddenBatchJson.rows_hidden": ("rows of its committed partitions"),
}
