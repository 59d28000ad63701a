-- The foreachBatch writer's hand-overs (PostgreSQL's schema 11, sql/011_handovers.sql):
-- one row per run, the latest batch it was handed, recorded before anything of the batch
-- is written; a later batch is refused while an earlier handed one is undecided above
-- the highest decision (core/writer_batch.unfinished_handovers).
CREATE TABLE IF NOT EXISTS handovers (
    sink_id   varchar(64)  NOT NULL,
    run_id    varchar(64)  NOT NULL,
    batch_id  bigint       NOT NULL,
    handed_at datetime(6)  NOT NULL DEFAULT current_timestamp(6),
    PRIMARY KEY (sink_id, run_id)
) ENGINE=InnoDB
-- ;

INSERT IGNORE INTO schema_version (version) VALUES (2)
