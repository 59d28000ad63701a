"""Option deadLetterTable, without Spark: a partition with bad rows of each kind the sink
judges keeps them in the dead-letter table, in its own prepared transaction; rows only the
server refuses still fail the batch, naming the row and the constraint."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sqlsink.core.model import NewDecision, TaskIdentity
from sqlsink.errors import ConfigError, WriteError
from sqlsink.options import SinkOptions
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.dead_letters import ensure_table
from sqlsink.postgres.partition import write_partition
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import TargetPlan, plan_target
from sqlsink.tablename import TableName
from tests.fix_pg import PgServer, prepared_transactions

COLUMNS = (
    "id bigint NOT NULL, name text, code varchar(3), qty integer, price numeric(5,2), "
    "ratio numeric, born date, token uuid"
)


def good(i: int) -> dict[str, object]:
    return {
        "id": i,
        "name": f"n{i}",
        "code": "ab ",
        "qty": i,
        "price": 1.5,
        "ratio": 0.5,
        "born": datetime.date(2020, 1, 1),
        "token": str(uuid.UUID(int=i)),
    }


# one bad row of each kind: (id, column, value, reason's start)
BAD = [
    (101, "name", "a\x00b", "a NUL character"),
    (102, "id", None, "NULL into a NOT NULL column"),
    (103, "code", "abcd", "longer than character varying(3)"),
    (104, "qty", 2**40, "out of range for integer"),
    (105, "ratio", float("inf"), "infinity cannot be stored in numeric"),
    (106, "price", 1000.0, "out of range for numeric(5,2)"),
    (107, "born", None, None),  # the encoder's own check: out_of_range_date()
    (108, "token", "not-a-uuid", "'not-a-uuid' is not a UUID"),
    (109, "name", b"\xff\xfe", "invalid UTF-8"),
]


def schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("code", pa.string()),
            ("qty", pa.int64()),
            ("price", pa.decimal128(12, 2)),
            ("ratio", pa.float64()),
            ("born", pa.date32()),
            ("token", pa.string()),
        ]
    )


def batch_of(records: list[dict[str, object]]) -> pa.RecordBatch:
    """The records as a batch; bytes in a string column are put in as they are (invalid
    UTF-8 that Arrow would refuse to build)."""
    columns = []
    for field in schema():
        values = [r[field.name] for r in records]
        if pa.types.is_string(field.type) and any(isinstance(v, bytes) for v in values):
            raw = pa.array(
                [v if isinstance(v, bytes) or v is None else str(v).encode() for v in values],
                pa.binary(),
            )
            columns.append(pa.Array.from_buffers(pa.string(), len(raw), raw.buffers()))
        elif field.name == "price":
            import decimal

            columns.append(
                pa.array([decimal.Decimal(str(v)) for v in values], pa.decimal128(12, 2))
            )
        else:
            columns.append(pa.array(values, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema())


def bad_records() -> list[dict[str, object]]:
    out = []
    for i, column, value, _ in BAD:
        record = good(i)
        if column == "born":  # date32 days out of PostgreSQL's range: the encoder's own check
            continue
        record[column] = value
        out.append(record)
    return out


def out_of_range_date() -> pa.RecordBatch:
    b = batch_of([good(107)])
    days = pa.array([2**31 - 1], pa.date32())
    return b.set_column(6, "born", days)


@pytest.fixture
def dead_table(pg_url: str) -> Iterator[str]:
    name = f"dl_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def setup(pg_url: str, table: str, **more: str) -> tuple[SinkOptions, TargetPlan, str]:
    sink = f"dl-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        conn.execute(sql.SQL("CREATE TABLE {} (" + COLUMNS + ")").format(sql.Identifier(table)))
        options = SinkOptions.parse({"url": pg_url, "table": table, "sinkId": sink, **more})
        target = plan_target(conn, options, schema().names, None, schema())  # type: ignore[arg-type]
        if options.dead_letter_table is not None:
            ensure_table(conn, options.dead_letter_table, options.table)  # type: ignore[arg-type]
    return options, target, sink


def task(sink: str, batch: int = 0) -> TaskIdentity:
    return TaskIdentity(sink, batch, 0, "run1", 0, 0, query_id=None)


def commit(pg_url: str, sink: str, batch: int, gid: str | None, rows: int) -> None:
    assert gid is not None
    with psycopg.connect(pg_url, autocommit=True) as conn:
        backend = PostgresBackend(conn)  # type: ignore[arg-type]
        backend.insert_decision(NewDecision(sink, batch, [gid], rows, None, "run1"))
        backend.commit_prepared(gid)


def test_bad_rows_of_each_kind_go_to_the_dead_letter_table_with_the_good_rows(
    pg_url: str, pg_server: PgServer, table: str, dead_table: str
) -> None:
    options, target, sink = setup(pg_url, table, deadLetterTable=dead_table)
    records = [good(i) for i in range(5)] + bad_records() + [good(i) for i in range(5, 10)]
    batches = [batch_of(records), out_of_range_date(), batch_of([good(10)])]
    outcome = write_partition(options, target, task(sink), batches)
    assert outcome.rows == 11 and outcome.dead_letters == len(BAD)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # prepared, not committed: neither the rows nor the dead letters are visible
        count = sql.SQL("SELECT count(*) FROM {}")
        assert conn.execute(count.format(sql.Identifier(dead_table))).fetchone() == (0,)
        commit(pg_url, sink, 0, outcome.gid, outcome.rows)
        ids = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table)))
        assert [r[0] for r in ids] == list(range(11))
        marker = conn.execute(
            "SELECT rows FROM sqlsink.markers WHERE gid = %s", (outcome.gid,)
        ).fetchone()
        assert marker == (11,)
        dead = conn.execute(
            sql.SQL(
                "SELECT sink_id, target_table, batch_id, partition_id, row_number, column_name, "
                "reason, row_json FROM {} ORDER BY row_number"
            ).format(sql.Identifier(dead_table))
        ).fetchall()
    assert {d[0] for d in dead} == {sink} and {d[1] for d in dead} == {f"public.{table}"}
    assert {(d[2], d[3]) for d in dead} == {(0, 0)}
    by_id = {(d[7]["id"] if d[7]["id"] is not None else 102): d for d in dead}
    assert sorted(by_id) == [i for i, *_ in BAD]
    for i, column, _, reason in BAD:
        row = by_id[i]
        assert row[5] == column, row
        if reason is not None:
            assert row[6].startswith(reason), row
    assert "out of PostgreSQL's date range" in by_id[107][6]
    # positions in the partition: the first batch's 5 good rows, then the bad ones in order
    assert [by_id[i][4] for i, *_ in BAD] == [5, 6, 7, 8, 9, 10, 18, 11, 12]
    nul = by_id[101]
    assert nul[7]["name"] == "a\\u0000b" and "jsonb refuses them" in nul[6]
    assert by_id[109][7]["name"] == "\ufffd\ufffd"
    assert by_id[105][7]["ratio"] == "inf"
    assert prepared_transactions(pg_server.admin_url) == []


def test_a_rolled_back_partition_leaves_no_dead_letters(
    pg_url: str, table: str, dead_table: str
) -> None:
    """The dead letters are in the partition's transaction: a rolled-back attempt (a
    batch not decided) leaves none, so a retried batch writes them once."""
    options, target, sink = setup(pg_url, table, deadLetterTable=dead_table)
    first = write_partition(options, target, task(sink), [batch_of([good(1), *bad_records()])])
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(first.gid)))
    again = TaskIdentity(sink, 0, 0, "run2", 1, 1, query_id=None)
    second = write_partition(options, target, again, [batch_of([good(1), *bad_records()])])
    commit(pg_url, sink, 0, second.gid, second.rows)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        count = sql.SQL("SELECT count(*) FROM {}")
        assert conn.execute(count.format(sql.Identifier(dead_table))).fetchone() == (8,)
        assert conn.execute(count.format(sql.Identifier(table))).fetchone() == (1,)


def test_at_least_once_and_upsert_keep_dead_letters_too(
    pg_url: str, table: str, dead_table: str
) -> None:
    options, target, sink = setup(
        pg_url, table, deadLetterTable=dead_table, semantic="at_least_once"
    )
    outcome = write_partition(options, target, task(sink), [batch_of([good(1), *bad_records()])])
    assert (outcome.rows, outcome.dead_letters) == (1, 8)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        count = sql.SQL("SELECT count(*) FROM {}")
        assert conn.execute(count.format(sql.Identifier(dead_table))).fetchone() == (8,)
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(sql.Identifier(table)))
        options = SinkOptions.parse(
            {"url": pg_url, "table": table, "sinkId": sink, "mode": "upsert",
             "deadLetterTable": dead_table}
        )  # fmt: skip
        target = plan_target(conn, options, schema().names, None, schema())  # type: ignore[arg-type]
    upsert = write_partition(
        options, target, task(sink, 1), [batch_of([good(1), good(2), *bad_records()])]
    )
    assert (upsert.rows, upsert.dead_letters) == (2, 8)
    commit(pg_url, sink, 1, upsert.gid, upsert.rows)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute(count.format(sql.Identifier(dead_table))).fetchone() == (16,)
        json_keys = conn.execute(
            sql.SQL("SELECT row_json FROM {} WHERE batch_id = 1 LIMIT 1").format(
                sql.Identifier(dead_table)
            )
        ).fetchone()
        assert json_keys is not None and sorted(json_keys[0]) == sorted(schema().names)


def test_without_the_option_a_bad_row_fails_the_batch_naming_row_and_column(
    pg_url: str, table: str
) -> None:
    options, target, sink = setup(pg_url, table)
    records = [good(0), good(1), {**good(2), "name": "a\x00b"}]
    with pytest.raises(WriteError) as failed:
        write_partition(options, target, task(sink), [batch_of(records)])
    text = str(failed.value)
    assert "row 3 of the partition's COPY" in text and "column 'name'" in text, text
    with pytest.raises(WriteError) as encoded:
        write_partition(
            options, target, task(sink), [batch_of([good(0), {**good(1), "qty": 2**40}])]
        )
    assert "column 'qty' (integer), row 1 of the batch" in str(encoded.value)


def test_rows_only_the_server_refuses_fail_the_batch_naming_row_and_constraint(
    pg_url: str, table: str, dead_table: str
) -> None:
    options, target, sink = setup(pg_url, table, deadLetterTable=dead_table)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT qty_positive CHECK (qty >= 0)").format(
                sql.Identifier(table)
            )
        )
    records = [good(0), {**good(1), "name": "a\x00b"}, {**good(2), "qty": -1}]
    with pytest.raises(WriteError) as failed:
        write_partition(options, target, task(sink), [batch_of(records)])
    text = str(failed.value)
    # the NUL row went to the dead letters, so the refused row is the COPY's second
    assert "row 2 of the partition's COPY" in text and "constraint 'qty_positive'" in text, text
    with psycopg.connect(pg_url, autocommit=True) as conn:
        count = sql.SQL("SELECT count(*) FROM {}")
        assert conn.execute(count.format(sql.Identifier(dead_table))).fetchone() == (0,)


def test_the_option_names_a_table_other_than_the_target() -> None:
    url = "postgresql://h/db"
    parsed = SinkOptions.parse({"url": url, "table": "s.t", "deadLetterTable": "bad"})
    assert parsed.dead_letter_table == TableName("s", "bad")
    with pytest.raises(ConfigError, match="is the target table itself"):
        SinkOptions.parse({"url": url, "table": "s.t", "deadLetterTable": "s.t"})


def test_a_role_that_may_not_insert_into_the_table_is_refused_at_planning(
    pg_server: PgServer, dead_table: str
) -> None:
    role = f"dl_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        ensure_table(conn, TableName("public", dead_table), TableName("public", "t"))  # type: ignore[arg-type]
    try:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(pg_server.url)
        host = parts.netloc.rsplit("@", 1)[-1]
        url = urlunsplit(parts._replace(netloc=f"{role}@{host}"))
        with psycopg.connect(url, autocommit=True) as conn:
            with pytest.raises(ConfigError) as refused:
                ensure_table(conn, TableName("public", dead_table), TableName("public", "t"))  # type: ignore[arg-type]
            assert f"role {role!r} may not insert into table public.{dead_table}" in str(
                refused.value
            )
            with pytest.raises(ConfigError) as missing:
                ensure_table(conn, TableName("public", "dl_absent"), TableName("public", "t"))  # type: ignore[arg-type]
            assert "may not create it" in str(missing.value)
            assert 'CREATE TABLE IF NOT EXISTS "public"."dl_absent"' in str(missing.value)
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_screen_passes_a_good_batch_through_untouched_and_rounds_as_numeric_does() -> None:
    """No bad row: the very batch goes on (no filter, no copy). numeric(5,2) rounds to 2
    places first: 999.994 fits, 999.995 (1000.00) does not; char(3) cuts trailing spaces."""
    import decimal

    from sqlsink.postgres.catalog import TargetColumn
    from sqlsink.postgres.encoding.screen import Screen

    columns = [
        TargetColumn("p", 1700, "numeric(5,2)", False, False),
        TargetColumn("c", 1042, "character(3)", True, False),
    ]
    fields = [pa.field("p", pa.decimal128(12, 3)), pa.field("c", pa.string())]
    screen = Screen(fields, columns)
    values = [decimal.Decimal(v) for v in ("999.994", "1.5", "-2", "999.995")]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(values, pa.decimal128(12, 3)), pa.array(["abc", "ab   ", None, "a"])],
        schema=pa.schema(fields),
    )
    good = batch.slice(0, 2)
    assert screen.judge(good).good is good
    judged = screen.judge(batch)
    assert judged.bad.tolist() == [2, 3]
    assert judged.columns == ("c", "p")
    assert judged.reasons == ("NULL into a NOT NULL column", "out of range for numeric(5,2)")
    assert judged.good.num_rows == 2


def test_a_unique_violation_in_append_fails_the_batch_naming_the_key_and_constraint(
    pg_url: str, table: str, dead_table: str
) -> None:
    options, target, sink = setup(pg_url, table, deadLetterTable=dead_table)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT one_id UNIQUE (id)").format(
                sql.Identifier(table)
            )
        )
    with pytest.raises(WriteError) as failed:
        write_partition(options, target, task(sink), [batch_of([good(0), good(1), good(1)])])
    text = str(failed.value)
    assert "constraint 'one_id'" in text and "Key (id)=(1) already exists" in text, text
