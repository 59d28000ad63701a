-- sqlsink commit log, schema version 3: who may write a sink, which run of it is the
-- live one, and decisions that no plain statement can erase (docs/DESIGN.md
-- invariants 8, 9 and 10). Applied with a bounded lock wait: it takes locks on
-- sinks and decisions only, never on markers, which prepared leftovers hold.

-- The writer a sink is bound to: one streaming query (query_id) or one named batch
-- load. Rows of version 2 with no query were written by the batch writer.
ALTER TABLE sqlsink.sinks
    ADD COLUMN writer text CHECK (writer IN ('stream', 'load')),
    ADD COLUMN newest_run text,        -- the fencing token: the run seen first most recently
    ADD COLUMN pruned_through bigint;  -- decisions up to this batch were complete and pruned
UPDATE sqlsink.sinks SET writer = CASE WHEN query_id IS NULL THEN 'load' ELSE 'stream' END;

-- Every run that wrote or committed for a sink. A run is live while its heartbeat
-- is younger than live_for; a superseded run can never become the newest again.
CREATE TABLE sqlsink.runs (
    sink_id            text        NOT NULL REFERENCES sqlsink.sinks,
    run_id             text        NOT NULL,
    first_seen         timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    live_for           interval    NOT NULL,
    superseded_at      timestamptz,
    superseded_by      text,       -- a newer run's id, or 'operator' (recover --force)
    aborted_batch      bigint,     -- Spark aborted this run's batches up to here
    lock_pid           integer,    -- the session that holds the sink lock for this run
    lock_backend_start timestamptz,
    PRIMARY KEY (sink_id, run_id)
);

-- A decision is never erased with its sink (version 1 cascaded: following old advice
-- could half-commit a batch); `sqlsink forget` removes a finished sink's log.
ALTER TABLE sqlsink.decisions
    DROP CONSTRAINT decisions_sink_id_fkey,
    ADD CONSTRAINT decisions_sink_id_fkey FOREIGN KEY (sink_id) REFERENCES sqlsink.sinks;

-- Only a session that set sqlsink.forget to the sink's id may (sqlsink forget does,
-- after its own checks): a plain statement, typed from old advice, may not.
CREATE FUNCTION sqlsink.keep_incomplete_decisions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        IF EXISTS (SELECT 1 FROM sqlsink.decisions WHERE completed_at IS NULL) THEN
            RAISE EXCEPTION 'sqlsink: the commit log holds incomplete decisions (batches '
                'whose transactions are still prepared); truncating it would lose them'
                USING HINT = 'run: sqlsink recover, then sqlsink forget --sink-id ID';
        END IF;
        RETURN NULL;
    END IF;
    IF current_setting('sqlsink.forget', true) = OLD.sink_id THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'sqlsink: the decision of sink %, batch % is incomplete (some of its '
        'transactions are still prepared); deleting it would lose them', OLD.sink_id, OLD.batch_id
        USING HINT = 'run: sqlsink recover --sink-id ' || OLD.sink_id
            || ', then sqlsink forget --sink-id ' || OLD.sink_id;
END $$;

CREATE TRIGGER keep_incomplete BEFORE DELETE ON sqlsink.decisions
    FOR EACH ROW WHEN (OLD.completed_at IS NULL)
    EXECUTE FUNCTION sqlsink.keep_incomplete_decisions();
CREATE TRIGGER keep_incomplete_on_truncate BEFORE TRUNCATE ON sqlsink.decisions
    FOR EACH STATEMENT EXECUTE FUNCTION sqlsink.keep_incomplete_decisions();

-- A sink with decided batches is removed by `sqlsink forget`, not by a plain DELETE.
CREATE FUNCTION sqlsink.keep_decided_sinks() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sqlsink.decisions WHERE sink_id = OLD.sink_id) THEN
        RAISE EXCEPTION 'sqlsink: sink % has decided batches in its commit log; a plain '
            'DELETE cannot tell finished batches from half-committed ones', OLD.sink_id
            USING HINT = 'run: sqlsink forget --sink-id ' || OLD.sink_id
                || ' (it refuses while anything of the sink is unfinished)';
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER keep_decided BEFORE DELETE ON sqlsink.sinks
    FOR EACH ROW EXECUTE FUNCTION sqlsink.keep_decided_sinks();

INSERT INTO sqlsink.schema_version (version) VALUES (3);
