-- sqlsink commit log, schema version 4: what each run found when it related Spark's
-- checkpoint to the commit log (docs/DESIGN.md invariant 9, issue 12 item 4), so
-- that `sqlsink status` can show it. Applied with a bounded lock wait; it locks
-- sqlsink.runs only (no partition transaction holds it), never markers.

ALTER TABLE sqlsink.runs
    -- verified: every batch of the checkpoint's commits/ from the sink's first on is
    --   decided; loss: some are not (checkpoint_lost), the commit stopped;
    -- unverified: the checkpoint could not be read; off: option checkpointCheck=off
    ADD COLUMN checkpoint_verdict    text
        CHECK (checkpoint_verdict IN ('verified', 'loss', 'unverified', 'off')),
    ADD COLUMN checkpoint_detail     text,
    ADD COLUMN checkpoint_lost       bigint[],     -- batches Spark committed, not decided
    ADD COLUMN checkpoint_location   text,         -- as shown (no secrets)
    ADD COLUMN checkpoint_batch      bigint,       -- the batch whose commit checked
    ADD COLUMN checkpoint_checked_at timestamptz;

INSERT INTO sqlsink.schema_version (version) VALUES (4);
