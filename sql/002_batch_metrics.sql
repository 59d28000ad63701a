-- sqlsink commit log, schema version 2: per-batch metrics, for `sqlsink status`
-- and dashboards (one row per batch is already there: the decision).
ALTER TABLE sqlsink.decisions
    ADD COLUMN partitions     integer,           -- partitions that wrote rows
    ADD COLUMN first_write_at timestamptz,       -- the batch's first partition write
    ADD COLUMN commit_ms      double precision,  -- COMMIT PREPARED of all its gids
    ADD COLUMN orphans        integer;           -- orphans rolled back by this commit

INSERT INTO sqlsink.schema_version (version) VALUES (2);
