-- sqlsink commit log, schema version 7: each run records a token of the Spark driver
-- its tasks were planned by (docs/DESIGN.md invariant 10). Spark may abort a batch
-- before any task of it reported (the failed ones report nothing, the running ones not
-- yet); a stream's run id lives only in the tasks' local properties, so the abort,
-- which runs in a Python worker of the driver, finds its own run by this token: a
-- digest of the driver JVM (host, pid, start time) and the sink, which every Python
-- worker of that driver computes alike (sqlsink/spark/driver_token.py). Only a
-- column of sqlsink.runs: no lock on the tables prepared leftovers hold.

ALTER TABLE sqlsink.runs ADD COLUMN writer_token text;

INSERT INTO sqlsink.schema_version (version) VALUES (7);
