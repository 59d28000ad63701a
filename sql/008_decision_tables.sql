-- sqlsink commit log, schema version 8: each decision names the tables its batch wrote
-- (schema.name), so that `sqlsink status` can say which table a
-- sink writes (a sink id or a query id alone does not tell an operator). A sink of the
-- foreachBatch writer may write several tables in one batch. NULL: a decision written
-- before version 8. Only a column of sqlsink.decisions: no lock on the tables prepared
-- leftovers hold.

ALTER TABLE sqlsink.decisions ADD COLUMN tables text[];

INSERT INTO sqlsink.schema_version (version) VALUES (8);
