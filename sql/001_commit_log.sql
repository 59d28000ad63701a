-- sqlsink commit log, schema version 1.
-- Applied by the sink (sqlsink.postgres.schema) inside one transaction, under an
-- advisory lock, when sqlsink.schema_version says it is missing. Later versions
-- come as 002_*.sql, 003_*.sql, ... and are applied in order.

-- Not "CREATE SCHEMA IF NOT EXISTS": that needs CREATE on the database even when
-- the schema exists, and the least-privilege role (sql/setup_role.sql) owns a
-- pre-created schema without that right.
DO $$ BEGIN
    IF to_regnamespace('sqlsink') IS NULL THEN
        CREATE SCHEMA sqlsink;
    END IF;
END $$;

CREATE TABLE IF NOT EXISTS sqlsink.schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- One row per sink: the streaming query it is bound to (DESIGN.md invariant 8).
CREATE TABLE sqlsink.sinks (
    sink_id    text PRIMARY KEY,
    query_id   text,
    created_at timestamptz NOT NULL DEFAULT now(),
    bound_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per decided batch: exactly the gids to commit (invariant 2). Written
-- once (primary key), before any of them is committed (invariant 1).
CREATE TABLE sqlsink.decisions (
    sink_id      text        NOT NULL REFERENCES sqlsink.sinks ON DELETE CASCADE,
    batch_id     bigint      NOT NULL,
    gids         text[]      NOT NULL,
    rows         bigint      NOT NULL,
    query_id     text,
    run_id       text,
    decided_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at timestamptz,  -- every gid committed and verified
    PRIMARY KEY (sink_id, batch_id)
);
CREATE INDEX decisions_incomplete ON sqlsink.decisions (sink_id) WHERE completed_at IS NULL;

-- One row per partition transaction, inserted inside it: a decided gid that is no
-- longer prepared was committed exactly when its marker is visible (invariant 5).
CREATE TABLE sqlsink.markers (
    gid          text        PRIMARY KEY,
    sink_id      text        NOT NULL,
    batch_id     bigint      NOT NULL,
    partition_id integer     NOT NULL,
    rows         bigint      NOT NULL,
    written_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX markers_batch ON sqlsink.markers (sink_id, batch_id);

INSERT INTO sqlsink.schema_version (version) VALUES (1);
