import json
from pathlib import Path

import pytest

from sqlsink.conninfo import params_of, redact, without_password
from sqlsink.errors import ConfigError
from sqlsink.options import Semantic, SinkOptions, checkpoint_query_id, parse_duration
from sqlsink.postgres.connection import conninfo, scrub
from sqlsink.tablename import TableName


def test_options_are_case_insensitive_with_defaults() -> None:
    opts = SinkOptions.parse({"URL": "postgresql://a@h/db", "Table": "Public.Events"})
    assert opts.table == TableName("public", "events")
    assert opts.semantic is Semantic.EXACTLY_ONCE
    assert opts.sink_id is None and opts.create_table is False


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        SinkOptions.parse({"tabel": "x", "sematic": "none"})
    message = str(err.value)
    for part in (
        "unknown option 'tabel'",
        "unknown option 'sematic'",
        "url is required",
        "table is required",
        "known options",
    ):
        assert part in message


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"semantic": "twice"}, "unknown value 'twice'.*exactly_once, at_least_once, none"),
        ({"sinkId": "a_b"}, "invalid sinkId"),
        ({"sinkId": 'x"; DROP TABLE y; --'}, "invalid sinkId"),
        ({"createTable": "maybe"}, "is not true or false"),
        ({"mode": "merge"}, "mode: unknown value 'merge' .choose one of append, upsert"),
        ({"keyColumns": "id"}, "keyColumns needs mode=upsert"),
        ({"deleteColumn": "gone"}, "deleteColumn needs mode=upsert"),
        ({"lockTimeout": "soon"}, "not a duration"),
        ({"table": "a.b.c"}, "invalid table name"),
    ],
)
def test_bad_values(options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SinkOptions.parse({"url": "postgresql://h/db", "table": "t", **options})


def test_quoted_table_names_keep_case_and_quotes() -> None:
    assert TableName.parse('"My Schema"."Odd ""Name"""') == TableName("My Schema", 'Odd "Name"')
    assert TableName.parse("events") == TableName("public", "events")
    with pytest.raises(ValueError, match="invalid table name"):
        TableName.parse('x"; DROP TABLE y; --')  # an unbalanced quote is refused
    # anything else becomes one identifier, always quoted when rendered
    assert TableName.parse("x; DROP TABLE y; --") == TableName("public", "x; drop table y; --")


def test_durations() -> None:
    assert parse_duration("d", "500ms") == 0.5
    assert parse_duration("d", "15min") == 900
    assert parse_duration("d", "2") == 2


def test_password_never_in_repr_or_redacted_urls() -> None:
    opts = SinkOptions.parse(
        {"url": "postgresql://app:hunter2@db/shop", "table": "t", "password": "pw-option"}
    )
    assert "hunter2" not in repr(opts) and "pw-option" not in repr(opts)
    assert redact("postgresql://app:hunter2@db:5432/shop") == "postgresql://app:***@db:5432/shop"
    assert "hunter2" not in redact("host=db password=hunter2 user=app")
    assert "hunter2" not in redact("host=db password='hun ter2' user=app")
    assert "hunter2" not in redact("postgresql://db/shop?password=hunter2&sslmode=off")
    assert scrub("failed for hunter2", "postgresql://app:hunter2@db/shop") == "failed for ***"


@pytest.mark.parametrize("char", ["/", "#", "?", "@"])
@pytest.mark.parametrize("scheme", ["postgresql", "mariadb", "jdbc:mysql"])
def test_a_password_with_an_unencoded_special_character_is_redacted(scheme: str, char: str) -> None:
    """The user info ends at the URL's last '@' (as a human reads it), not at the first
    '/', '#' or '?': libpq reads 'postgresql://u:pa/ss@h/db' as host u, port pa."""
    url = f"{scheme}://app:hun{char}ter2@db:5432/shop"
    said = f"invalid url {url!r}: percent-encode it"
    assert redact(url) == f"{scheme}://app:***@db:5432/shop"
    assert "ter2" not in redact(said) and "hun" not in redact(said)
    bare, had = without_password(url)
    assert had and bare == f"{scheme}://app@db:5432/shop"
    if char != "@":  # the parsers end the user info at the '/', '#' or '?': refused
        with pytest.raises(ConfigError) as caught:
            SinkOptions.parse({"url": url, "table": "t"})
        assert "ter2" not in str(caught.value) and "hun" not in str(caught.value)
        assert f"{char!r} that is not percent-encoded" in str(caught.value)
        with pytest.raises(ConfigError) as caught:
            params_of(url)
        assert "ter2" not in str(caught.value) and "hun" not in str(caught.value)


def test_an_at_sign_in_a_query_value_ends_no_user_info() -> None:
    url = "postgresql://app:hunter2@db/shop?application_name=me@there"
    assert redact(url) == "postgresql://app:***@db/shop?application_name=me@there"
    assert redact("postgresql://db/shop?application_name=me@there").endswith("me@there")
    assert redact("postgresql://me@corp:hunter2@db/shop") == "postgresql://me@corp:***@db/shop"


def test_jdbc_prefix_and_password_option() -> None:
    info = conninfo("jdbc:postgresql://app@db:5432/shop", "s3cret")
    assert "password=s3cret" in info and "host=db" in info


def test_sink_id_defaults_to_the_checkpoint_query_id(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text(json.dumps({"id": "1234-abcd"}) + "\n")
    assert checkpoint_query_id(str(tmp_path)) == "1234-abcd"
    assert checkpoint_query_id(f"file://{tmp_path}") == "1234-abcd"
    assert checkpoint_query_id(str(tmp_path / "missing")) is None
    assert checkpoint_query_id("s3a://bucket/chk") is None


@pytest.mark.parametrize(
    ("url", "bare"),
    [
        ("postgresql://u:p%40ss@h:5/db", "postgresql://u@h:5/db"),
        ("postgresql://u@h/db?password=x&sslmode=require", "postgresql://u@h/db?sslmode=require"),
        ("postgresql://h/db?sslmode=require&password=x", "postgresql://h/db?sslmode=require"),
        ("host=h password='a b' dbname=d", "host=h dbname=d"),
        ("password=x host=h", "host=h"),
    ],
)
def test_a_fix_line_leaves_the_password_out_instead_of_masking_it(url: str, bare: str) -> None:
    """Issue 15 item 4: '***' in a command cannot be pasted; no password can."""
    assert without_password(url) == (bare, True)
    assert without_password(bare) == (bare, False)


def test_schema_evolution_is_checked_and_case_insensitive() -> None:
    parsed = SinkOptions.parse(
        {"url": "postgresql://x/y", "table": "t", "SCHEMAEVOLUTION": "ADDCOLUMNS"}
    )
    assert parsed.schema_evolution.value == "addColumns"
    with pytest.raises(ConfigError) as caught:
        SinkOptions.parse({"url": "postgresql://x/y", "table": "t", "schemaEvolution": "drop"})
    assert str(caught.value) == (
        "sqlsink options: option schemaEvolution: unknown value 'drop' (choose one of none, "
        "addColumns, widen)"
    )


def test_every_option_problem_is_in_one_message() -> None:
    """The README's promise: not the first problem, then the next at the next start."""
    with pytest.raises(ConfigError) as caught:
        SinkOptions.parse(
            {
                "url": "postgresql://x/y",
                "table": "t",
                "lockTimeout": "soon",
                "mode": "merge",
                "keepBatches": "0",
                "createTable": "maybe",
                "schemaEvolution": "drop",
                "semantic": "twice",
            }
        )
    text = str(caught.value)
    for said in (
        "option lockTimeout: 'soon' is not a duration",
        "option mode: unknown value 'merge'",
        "option keepBatches: '0' is not a whole number",
        "option createTable: 'maybe' is not true or false",
        "option schemaEvolution: unknown value 'drop'",
        "option semantic: unknown value 'twice'",
    ):
        assert said in text, text


def test_a_mode_error_offers_only_the_modes_of_the_entry_point() -> None:
    from sqlsink.options import Mode

    with pytest.raises(ConfigError) as caught:
        SinkOptions.parse(
            {"url": "postgresql://x/y", "table": "t", "mode": "merge"},
            modes=(Mode.APPEND, Mode.UPSERT),
        )
    assert "(choose one of append, upsert)" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        SinkOptions.parse({"url": "postgresql://x/y", "table": "t", "mode": "merge"})
    assert "(choose one of append, upsert, replace)" in str(caught.value)
