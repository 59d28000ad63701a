-- sqlsink commit log, schema version 9: each decision keeps its batch's figures (JSON,
-- core.model.BatchFigures.to_json): partitions, rows, bytes sent when known, each
-- partition's rows and write time (first write to PREPARE, on its own clock), the
-- slowest partition, and the driver's split (last PREPARE to decision, the decision's
-- write, the COMMIT PREPAREDs, the rest of the resolution) with commit_ms and orphans.
-- Written by the same UPDATE as commit_ms. NULL: a decision written before version 9,
-- or while an upgrade to it was deferred. One jsonb column rather than typed ones: the
-- per-partition part is a list, and a figure added later needs no ALTER TABLE of the
-- decisions. Only a column of sqlsink.decisions: no lock on the tables prepared
-- leftovers hold.

ALTER TABLE sqlsink.decisions ADD COLUMN figures jsonb;

INSERT INTO sqlsink.schema_version (version) VALUES (9);
