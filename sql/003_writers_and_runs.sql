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

-- A run registers at its tasks and commits (the Python data source API has no start
-- hook). The first time a run id is seen it becomes the newest run of the sink and
-- supersedes every other (fencing); a superseded run is told so, every time, and
-- changes nothing. Otherwise the call is a heartbeat (written at most once a second).
-- holds_lock: the caller holds the sink lock; its session is recorded, so that a
-- newer run can tell a paused holder provably of this run (pid and start time).
CREATE FUNCTION sqlsink.register_run(
    p_sink text, p_run text, p_live_for interval, p_holds_lock boolean
) RETURNS text  -- NULL: this run is the newest; else the run (or 'operator') that fenced it
LANGUAGE plpgsql AS $$
DECLARE
    fenced_by text;
    known boolean;
BEGIN
    INSERT INTO sqlsink.sinks (sink_id) VALUES (p_sink) ON CONFLICT (sink_id) DO NOTHING;
    PERFORM 1 FROM sqlsink.sinks s WHERE s.sink_id = p_sink FOR UPDATE;  -- one at a time
    SELECT true, coalesce(r.superseded_by, CASE WHEN r.superseded_at IS NOT NULL
                                           THEN 'operator' END)
      INTO known, fenced_by
      FROM sqlsink.runs r WHERE r.sink_id = p_sink AND r.run_id = p_run;
    IF fenced_by IS NOT NULL THEN
        RETURN fenced_by;
    END IF;
    IF known IS NULL THEN
        UPDATE sqlsink.runs SET superseded_at = clock_timestamp(), superseded_by = p_run
         WHERE sink_id = p_sink AND superseded_at IS NULL;
        INSERT INTO sqlsink.runs (sink_id, run_id, live_for) VALUES (p_sink, p_run, p_live_for);
        UPDATE sqlsink.sinks SET newest_run = p_run WHERE sink_id = p_sink;
    END IF;
    IF p_holds_lock THEN
        UPDATE sqlsink.runs
           SET heartbeat_at = clock_timestamp(), live_for = p_live_for,
               lock_pid = pg_backend_pid(),
               lock_backend_start = (SELECT backend_start FROM pg_stat_activity
                                      WHERE pid = pg_backend_pid())
         WHERE sink_id = p_sink AND run_id = p_run;
    ELSIF known THEN
        UPDATE sqlsink.runs SET heartbeat_at = clock_timestamp(), live_for = p_live_for
         WHERE sink_id = p_sink AND run_id = p_run
           AND heartbeat_at < clock_timestamp() - interval '1 second';
    END IF;
    RETURN NULL;
END $$;

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
