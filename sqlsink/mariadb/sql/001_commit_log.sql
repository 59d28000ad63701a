-- sqlsink commit log on MariaDB, schema version 1: the meaning of the PostgreSQL commit
-- log (sql/*.sql, up to its version 10) in one step, in the commit log's own database
-- (sqlsink/mariadb/schema.py runs each statement in turn, under the named lock
-- 'sqlsink:schema', and records the version last). Times are UTC (every session of the
-- backend sets time_zone '+00:00'). A statement ends at a line '-- ;'.

CREATE TABLE IF NOT EXISTS schema_version (
    version    integer PRIMARY KEY,
    applied_at datetime(6) NOT NULL DEFAULT current_timestamp(6)
) ENGINE=InnoDB
-- ;

-- One row per sink: the writer it is bound to (invariant 8) and the fencing token.
CREATE TABLE IF NOT EXISTS sinks (
    sink_id        varchar(64)  NOT NULL PRIMARY KEY,
    writer         varchar(8)   CHECK (writer IN ('stream', 'load')),
    query_id       varchar(255),
    newest_run     varchar(64),
    pruned_through bigint,
    created_at     datetime(6)  NOT NULL DEFAULT current_timestamp(6),
    bound_at       datetime(6)  NOT NULL DEFAULT current_timestamp(6)
) ENGINE=InnoDB
-- ;

-- One row per decided batch: exactly the gids to commit (invariant 2), written once,
-- before any of them is committed (invariant 1). gids, tables: JSON arrays.
CREATE TABLE IF NOT EXISTS decisions (
    sink_id        varchar(64) NOT NULL,
    batch_id       bigint      NOT NULL,
    gids           longtext    NOT NULL CHECK (json_valid(gids)),
    row_count      bigint      NOT NULL,
    query_id       varchar(255),
    run_id         varchar(64),
    decided_at     datetime(6) NOT NULL DEFAULT current_timestamp(6),
    completed_at   datetime(6),
    partitions     integer,
    first_write_at datetime(6),
    commit_ms      double,
    orphans        integer,
    figures        longtext CHECK (figures IS NULL OR json_valid(figures)),
    tables         longtext CHECK (tables IS NULL OR json_valid(tables)),
    PRIMARY KEY (sink_id, batch_id),
    CONSTRAINT decisions_sink FOREIGN KEY (sink_id) REFERENCES sinks (sink_id)
) ENGINE=InnoDB
-- ;

-- One row per partition branch, inserted inside it: a decided gid that is no longer
-- prepared was committed exactly when its marker is visible (invariant 5).
CREATE TABLE IF NOT EXISTS markers (
    gid          varchar(200) NOT NULL PRIMARY KEY,
    sink_id      varchar(64)  NOT NULL,
    batch_id     bigint       NOT NULL,
    partition_id integer      NOT NULL,
    row_count    bigint       NOT NULL,
    written_at   datetime(6)  NOT NULL DEFAULT current_timestamp(6),
    KEY markers_batch (sink_id, batch_id)
) ENGINE=InnoDB
-- ;

-- Every run that wrote or committed for a sink (invariant 10); lock_conn: the
-- connection that holds the sink lock for this run (CONNECTION_ID()).
CREATE TABLE IF NOT EXISTS runs (
    sink_id               varchar(64) NOT NULL,
    run_id                varchar(64) NOT NULL,
    first_seen            datetime(6) NOT NULL DEFAULT current_timestamp(6),
    heartbeat_at          datetime(6) NOT NULL DEFAULT current_timestamp(6),
    live_for_s            double      NOT NULL,
    superseded_at         datetime(6),
    superseded_by         varchar(64),
    aborted_batch         bigint,
    lock_conn             bigint unsigned,
    writer_token          varchar(255),
    ended_at              datetime(6),
    ended_how             varchar(8) CHECK (ended_how IN ('stopped', 'failed')),
    ended_error           text,
    checkpoint_verdict    varchar(16)
        CHECK (checkpoint_verdict IN ('verified', 'loss', 'unverified', 'off')),
    checkpoint_detail     text,
    checkpoint_lost       longtext CHECK (checkpoint_lost IS NULL OR json_valid(checkpoint_lost)),
    checkpoint_location   text,
    checkpoint_batch      bigint,
    checkpoint_checked_at datetime(6),
    PRIMARY KEY (sink_id, run_id),
    CONSTRAINT runs_sink FOREIGN KEY (sink_id) REFERENCES sinks (sink_id)
) ENGINE=InnoDB
-- ;

-- A partition task's connection, while it writes: MariaDB has no application name, so
-- the committer finds a batch's task sessions here, joined to the process list.
CREATE TABLE IF NOT EXISTS task_sessions (
    conn_id      bigint unsigned NOT NULL PRIMARY KEY,
    sink_id      varchar(64)     NOT NULL,
    batch_id     bigint          NOT NULL,
    partition_id integer         NOT NULL,
    started_at   datetime(6)     NOT NULL DEFAULT current_timestamp(6),
    KEY task_sessions_batch (sink_id, batch_id)
) ENGINE=InnoDB
-- ;

-- An incomplete decision is erased only by `sqlsink forget`, which sets the session's
-- @sqlsink_forget to the sink's id after its own checks; a plain DELETE is refused.
CREATE OR REPLACE TRIGGER keep_incomplete BEFORE DELETE ON decisions FOR EACH ROW
BEGIN
    IF OLD.completed_at IS NULL AND NOT (@sqlsink_forget <=> OLD.sink_id) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT =
            'sqlsink: this decision is incomplete (some of its branches are still prepared); deleting it would lose them. Run: sqlsink recover, then sqlsink forget --sink-id ID';
    END IF;
END
-- ;

-- A sink with decided batches is removed by `sqlsink forget`, not by a plain DELETE.
CREATE OR REPLACE TRIGGER keep_decided BEFORE DELETE ON sinks FOR EACH ROW
BEGIN
    IF EXISTS (SELECT 1 FROM decisions WHERE sink_id = OLD.sink_id) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT =
            'sqlsink: this sink has decided batches in its commit log; a plain DELETE cannot tell finished batches from half-committed ones. Run: sqlsink forget --sink-id ID';
    END IF;
END
-- ;

INSERT IGNORE INTO schema_version (version) VALUES (1)
