-- The decisions' foreign key to sinks goes. InnoDB checks it with a shared lock on the
-- sink's row, held to the end of the decision's transaction, and every registration of
-- a run updates that row (sinks.newest_run): a driver paused inside its decision's
-- transaction kept the next run from registering (1205) and so from fencing it.
-- PostgreSQL's key check (FOR KEY SHARE) does not conflict with that update. The sink's
-- row is written before any decision of it (registration, or the decision's own
-- transaction), and `sqlsink forget` deletes the decisions before it.
ALTER TABLE decisions DROP FOREIGN KEY IF EXISTS decisions_sink
-- ;

INSERT IGNORE INTO schema_version (version) VALUES (3)
