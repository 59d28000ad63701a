-- sqlsink commit log, schema version 5: each partition's marker records the id of the
-- transaction that wrote it (docs/DESIGN.md invariant 13, issue 13), so that a consistent
-- view (option consistentView) can hide the rows of a batch that is committed in part:
-- every row a transaction inserts carries that transaction's id in its xmin.
--
-- It locks sqlsink.markers, which every prepared partition transaction also holds
-- until it is committed or rolled back. So it is applied only when the lock is free
-- at once; otherwise it is deferred (the sink works at version 4 meanwhile) and
-- retried at the next call of ensure_schema (postgres/schema.py). Both statements only
-- change the catalog: markers written before keep a NULL xid, and the view never hides
-- a row because of such a marker.
-- lock: sqlsink.markers

ALTER TABLE sqlsink.markers ADD COLUMN xid xid;
-- the partition transaction's own (top-level) transaction id; pg_current_xact_id(): 13+
ALTER TABLE sqlsink.markers ALTER COLUMN xid SET DEFAULT xid(pg_current_xact_id());
-- the view reads the markers of one sink: markers_batch (sink_id, batch_id) serves it

INSERT INTO sqlsink.schema_version (version) VALUES (5);
