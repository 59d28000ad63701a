-- sqlsink commit log, schema version 11: the foreachBatch writer's hand-overs. Before
-- anything of a stream's batch is written, the writer records that its run was handed
-- the batch (one row per run: its latest). A run handing a later batch while an earlier
-- recorded one is above the highest decided batch means the function returned from that
-- batch undecided (it caught the writer's error): Spark recorded it committed without
-- its rows, in this process or in one since gone. The writer refuses the later batch
-- with a data-loss error naming it (core/writer_batch.unfinished_handovers). A batch the
-- function never handed has no row here: it is a skipped batch, decided empty.

CREATE TABLE sqlsink.handovers (
    sink_id   text        NOT NULL,
    run_id    text        NOT NULL,
    batch_id  bigint      NOT NULL,
    handed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (sink_id, run_id)
);

INSERT INTO sqlsink.schema_version (version) VALUES (11);
