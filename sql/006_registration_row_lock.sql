-- sqlsink commit log, schema version 6: a run's registration locks its sink's row in
-- FOR NO KEY UPDATE mode, not FOR UPDATE (docs/DESIGN.md invariant 11). A decision's
-- foreign key holds FOR KEY SHARE on that row until its transaction ends; FOR UPDATE
-- conflicts with it, FOR NO KEY UPDATE does not. So a driver paused (a GC pause, a VM
-- stall) inside its decision's transaction no longer keeps the next run from
-- registering, which is what fences it and lets the next run end its session.
-- Registrations still take their sink one at a time, and wait for a first decision's
-- binding (an UPDATE of the row). Only the function changes: no table lock.

CREATE OR REPLACE FUNCTION sqlsink.register_run(
    p_sink text, p_run text, p_live_for interval, p_holds_lock boolean
) RETURNS text  -- NULL: this run is the newest; else the run (or 'operator') that fenced it
LANGUAGE plpgsql AS $$
DECLARE
    fenced_by text;
    known boolean;
BEGIN
    INSERT INTO sqlsink.sinks (sink_id) VALUES (p_sink) ON CONFLICT (sink_id) DO NOTHING;
    PERFORM 1 FROM sqlsink.sinks s WHERE s.sink_id = p_sink FOR NO KEY UPDATE;  -- one at a time
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

INSERT INTO sqlsink.schema_version (version) VALUES (6);
