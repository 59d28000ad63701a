"""Parsing a Spark checkpoint (``sqlsink.checkpoint``), and relating it to the log:
pure tests over files written here, no server and no Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sqlsink.checkpoint.files import display_location, is_local, local_path
from sqlsink.checkpoint.parse import Checkpoint, OffsetEntry, read_checkpoint, read_commits
from sqlsink.checkpoint.relation import STATES, DecisionState, relate
from sqlsink.errors import ConfigError


def entry(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def bare_checkpoint(root: Path, query_id: str = "q-1") -> Path:
    root.mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return root


def test_offsets_give_the_batch_timestamp_and_the_number_of_sources(tmp_path: Path) -> None:
    root = bare_checkpoint(tmp_path / "chk")
    entry(root / "offsets", "0", 'v1\n{"batchTimestampMs":1700,"conf":{}}\n{"a":1}\n{"b":2}')
    entry(root / "offsets", "1", "v1\nnot json\n{}")  # a timestamp it cannot read
    entry(root / "offsets", "2", 'v1\n{"batchTimestampMs":"soon"}')  # no source line
    entry(root / "offsets", "3", "v1")
    checkpoint = read_checkpoint(str(root))
    assert checkpoint.query_id == "q-1" and checkpoint.path == str(root)
    assert checkpoint.offsets == {
        0: OffsetEntry(0, 1700, 2),
        1: OffsetEntry(1, None, 1),
        2: OffsetEntry(2, None, 0),
        3: OffsetEntry(3, None, 0),
    }
    assert checkpoint.problems == [] and checkpoint.commits == set()
    assert checkpoint.last_offsets == 3 and checkpoint.last_commit is None


def test_only_batch_numbers_count_and_a_bad_entry_is_a_problem(tmp_path: Path) -> None:
    root = bare_checkpoint(tmp_path / "chk")
    for name in ("4", "5", "06", ".5.crc", ".6.0b1c.tmp", "notes", "12345678901234567890"):
        entry(root / "commits", name, "v1\n{}")
    entry(root / "commits", "7", "")  # empty: no header
    entry(root / "commits", "8", "{}\nv1")  # the header is not first
    (root / "commits" / "9").write_bytes(b"\xff\xfe")  # not UTF-8
    checkpoint = read_checkpoint(str(root))
    assert checkpoint.commits == {4, 5} and checkpoint.last_commit == 5
    assert checkpoint.offsets == {}  # no offsets/ folder: nothing, and no problem
    problems = "\n".join(checkpoint.problems)
    assert len(checkpoint.problems) == 3, problems
    assert f"{root}/commits/7: not a Spark log entry (no 'v1' header); ignored" in problems
    assert f"{root}/commits/8: not a Spark log entry" in problems
    assert f"{root}/commits/9: unreadable (UnicodeDecodeError" in problems
    # read_commits goes by name only: a renamed-into-place file is complete
    assert read_commits(str(root)) == {4, 5, 7, 8, 9}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (None, "no 'metadata' file"),
        ("", "cannot read the query id"),
        ("{not json", "cannot read the query id"),
        ('{"name":"q"}', "cannot read the query id"),
        ('{"id":""}', "cannot read the query id"),
        ('{"id":7}', "cannot read the query id"),
    ],
)
def test_a_checkpoint_without_a_query_id_is_refused(
    tmp_path: Path, metadata: str | None, message: str
) -> None:
    root = tmp_path / "chk"
    root.mkdir()
    if metadata is not None:
        (root / "metadata").write_text(metadata)
    with pytest.raises(ConfigError, match=message):
        read_checkpoint(str(root))


def test_a_missing_directory_or_a_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        read_checkpoint(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        read_checkpoint(str(tmp_path / "file"))


def test_file_uris_are_local_and_other_schemes_are_not(tmp_path: Path) -> None:
    root = bare_checkpoint(tmp_path / "a chk")
    uri = f"file://{str(root).replace(' ', '%20')}"
    assert is_local(uri) and is_local(str(root)) and is_local(r"C:\chk")
    assert local_path(uri) == root
    assert read_checkpoint(uri).query_id == "q-1"
    assert not is_local("s3a://bucket/chk")
    with pytest.raises(ConfigError, match="is not a local directory"):
        local_path("s3a://user:pw@bucket/chk")


def test_a_shown_location_hides_a_password_and_a_query_string() -> None:
    assert display_location("s3a://key:secret@bucket/chk") == "s3a://key:***@bucket/chk"
    assert display_location("gs://bucket/chk?sig=abc") == "gs://bucket/chk?***"
    assert display_location("file:///chk?x=1") == "file:///chk?x=1"  # local: as given


def done(rows: int = 1, prepared: int = 0, complete: bool = True) -> DecisionState:
    return DecisionState(complete=complete, rows=rows, gids=2, prepared=prepared)


def test_relate_says_what_happens_to_each_batch() -> None:
    checkpoint = Checkpoint("/chk", "q", commits={10, 11, 12, 13, 3})
    for batch in (10, 11, 12, 13, 14, 15, 16):
        checkpoint.offsets[batch] = OffsetEntry(batch, None, 1)
    decisions = {
        10: done(),
        11: done(prepared=1, complete=False),
        14: done(prepared=2, complete=False),
        18: done(),
        5: done(),
    }
    relations = relate(checkpoint, decisions, undecided_prepared={15: 2, 17: 1}, first_decided=5)
    got = {r.batch_id: (r.state, r.level) for r in relations}
    assert got == {
        3: ("no_decision", "info"),  # before the sink's first decision
        5: ("purged", "info"),
        10: ("consistent", "ok"),
        11: ("finishing", "warning"),
        12: ("no_decision", "warning"),
        13: ("no_decision", "warning"),
        14: ("replay_skip", "info"),
        15: ("rerun", "warning"),  # not the last offsets
        16: ("rerun", "info"),
        17: ("undecided", "info"),
        18: ("ahead", "warning"),
    }
    assert set(STATES) >= {state for state, _ in got.values()}
    by_batch = {r.batch_id: r for r in relations}
    assert by_batch[14].decision == "incomplete" and by_batch[14].rows == 1
    assert "2 of its 2 transaction(s) are still prepared" in by_batch[14].message
    # decided but not yet committed in full: "decided", never "committed in PostgreSQL"
    assert by_batch[14].message.startswith(
        "batch 14 is decided in PostgreSQL, its commit not finished, and not in Spark's "
        "commit log; Spark will replay it and the sink will skip it"
    )
    assert "its 2 prepared transaction(s) are rolled back" in by_batch[15].message
    assert "(not the last batch: unusual)" in by_batch[15].message
    assert by_batch[16].decision == "none" and by_batch[16].rows is None
    assert "its last offsets are for batch 16" in by_batch[18].message


def test_relate_over_commits_without_offsets_and_an_empty_checkpoint() -> None:
    checkpoint = Checkpoint("/chk", "q", commits={2})
    [only] = relate(checkpoint, {2: done()}, first_decided=0)
    assert (only.state, only.offsets, only.spark_committed) == ("consistent", False, True)
    [purged] = relate(Checkpoint("/chk", "q", commits={2}), {})
    assert purged.state == "no_decision" and purged.level == "info"
    assert relate(Checkpoint("/chk", "q"), {}) == []
    entries = Checkpoint("/chk", "q", offsets={4: OffsetEntry(4, None, 1)}, commits={3})
    states = {r.batch_id: r.state for r in relate(entries, {})}
    assert states == {3: "no_decision", 4: "rerun"}
