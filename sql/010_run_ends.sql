-- sqlsink commit log, schema version 10: how a run ended, when its driver could say it
-- (issue 30). A streaming query that stops (query.stop(), or failing with an
-- exception) is reported by Spark to the driver's StreamingQueryListener; the listener
-- sqlsink installs (spark/listener.py) records it here at once: when, how ('stopped' or
-- 'failed') and the error's first line (bounded, secrets scrubbed). `sqlsink status`
-- shows it (STOPPED, FAILED). A driver killed (SIGKILL, a lost machine) records
-- nothing: its run stays NULL here and is judged by its heartbeat as before. The end is
-- what the driver said, not a fencing: a run's liveness for recover (RUNS_SQL) is
-- unchanged. Only columns of sqlsink.runs: no lock on the tables prepared leftovers
-- hold.

ALTER TABLE sqlsink.runs
    ADD COLUMN ended_at timestamptz,
    ADD COLUMN ended_how text CHECK (ended_how IN ('stopped', 'failed')),
    ADD COLUMN ended_error text;

INSERT INTO sqlsink.schema_version (version) VALUES (10);
