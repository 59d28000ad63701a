"""Reading a checkpoint's commits/ (locally and through pyarrow.fs), and the pure rules
of the checkpoint check (sqlsink.core.checkpoint_check; issue 12 item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyarrow.fs import LocalFileSystem, SubTreeFileSystem

from sqlsink.checkpoint.files import display_location
from sqlsink.checkpoint.parse import checkpoint_policy, read_checkpoint, read_commits
from sqlsink.core.checkpoint_check import (
    CheckpointMode,
    LogCoverage,
    RunCheck,
    Unreadable,
    is_due,
    missing_decisions,
)
from sqlsink.errors import ConfigError
from sqlsink.options import SinkOptions


def spark_checkpoint(root: Path, commits: list[int]) -> Path:
    """metadata, offsets/ and commits/ as Spark writes them, with .crc and temp files."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": "q-7"}) + "\n")
    for n in commits:
        (root / "offsets" / str(n)).write_text(f'v1\n{{"batchTimestampMs":{n}}}\n{{"o":{n}}}')
        (root / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        (root / "commits" / f".{n}.crc").write_bytes(b"crc")
    (root / "commits" / ".9.0b1c.tmp").write_text("v1\n")  # a rename not done yet
    (root / "commits" / "notes.txt").write_text("not an entry")
    return root


def test_commits_are_read_by_name_locally_and_as_a_file_uri(tmp_path: Path) -> None:
    root = spark_checkpoint(tmp_path / "chk", [3, 4, 5, 10])
    assert read_commits(str(root)) == {3, 4, 5, 10}
    assert read_commits(f"file://{root}") == {3, 4, 5, 10}


def test_commits_are_read_through_a_pyarrow_filesystem(tmp_path: Path) -> None:
    """Any pyarrow.fs filesystem: here a SubTreeFileSystem over a local directory, the
    way an s3://, gs:// or hdfs:// URI is read through FileSystem.from_uri."""
    spark_checkpoint(tmp_path / "jobs" / "chk", [0, 1, 2])
    fs = SubTreeFileSystem(str(tmp_path / "jobs"), LocalFileSystem())
    assert read_commits("chk", filesystem=fs) == {0, 1, 2}
    checkpoint = read_checkpoint("chk/", filesystem=fs)
    assert checkpoint.query_id == "q-7"
    assert sorted(checkpoint.offsets) == [0, 1, 2] and checkpoint.commits == {0, 1, 2}
    assert checkpoint.offsets[2].timestamp_ms == 2
    # what the sink gets: the reader, and "unreadable" instead of an exception
    assert checkpoint_policy("chk", CheckpointMode.WARN, filesystem=fs).read_commits() == {0, 1, 2}
    gone = checkpoint_policy("nowhere", CheckpointMode.WARN, filesystem=fs).read_commits()
    assert isinstance(gone, Unreadable) and "is not a directory" in gone.reason


def test_a_fresh_checkpoint_has_no_commits_but_a_missing_one_is_unreadable(
    tmp_path: Path,
) -> None:
    root = tmp_path / "chk"
    root.mkdir()
    (root / "metadata").write_text('{"id":"q"}\n')
    assert read_commits(str(root)) == frozenset()  # nothing committed yet
    with pytest.raises(ConfigError, match="is not a directory"):
        read_commits(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no 'metadata' file"):
        read_commits(str(tmp_path))  # a directory, but not a checkpoint: not "empty"


def test_a_scheme_pyarrow_cannot_open_is_unreadable_and_keeps_secrets_out() -> None:
    location = "nosuchfs://user:s3cret@bucket/chk?sig=t0ken"
    with pytest.raises(ConfigError) as err:
        read_commits(location)
    assert "pyarrow.fs does not open it" in str(err.value)
    reader = checkpoint_policy(location, CheckpointMode.WARN)
    assert reader.location == "nosuchfs://user:***@bucket/chk?***"
    unreadable = reader.read_commits()
    assert isinstance(unreadable, Unreadable)
    for text in (str(err.value), unreadable.reason, reader.location):
        assert "s3cret" not in text and "t0ken" not in text


def test_display_location_leaves_plain_locations_alone() -> None:
    for plain in ("/chk/q", "file:///chk/q", "s3a://bucket/chk/q", "hdfs://nn:8020/chk"):
        assert display_location(plain) == plain


def coverage(first: int | None, decided: set[int], pruned: int | None = None) -> LogCoverage:
    return LogCoverage(first, pruned, frozenset(decided))


def test_missing_decisions_counts_from_the_sinks_first_batch() -> None:
    commits = range(10)
    # a tail lost: 7..9
    assert missing_decisions(commits, coverage(0, set(range(7)))) == [7, 8, 9]
    # a new sink (no decision): Spark's earlier batches are not its
    assert missing_decisions(commits, coverage(None, set())) == []
    # a sink that started at batch 5 (a new sink id on an old checkpoint)
    assert missing_decisions(commits, coverage(5, {5, 6, 7, 8, 9})) == []
    # retention pruned up to 4: only batches above it count
    assert missing_decisions(commits, coverage(5, {5, 6, 7}, pruned=4)) == [8, 9]
    # pruned, and everything above it lost too
    assert missing_decisions(commits, coverage(None, set(), pruned=4)) == [5, 6, 7, 8, 9]


def test_the_check_is_due_once_per_run_and_again_after_a_gap() -> None:
    warn, off = CheckpointMode.WARN, CheckpointMode.OFF
    assert is_due(warn, RunCheck(checked=False, highest=41), 42)  # first commit of a run
    assert not is_due(warn, RunCheck(checked=True, highest=41), 42)  # the log holds N-1
    assert not is_due(warn, RunCheck(checked=True, highest=42), 42)  # a replay of N
    assert is_due(warn, RunCheck(checked=True, highest=39), 42)  # decisions lost mid-run
    assert not is_due(warn, RunCheck(checked=True, highest=None), 42)  # nothing to lack
    assert is_due(off, RunCheck(checked=False, highest=39), 42)  # recorded as "off"
    assert not is_due(off, RunCheck(checked=True, highest=39), 42)


def test_the_option() -> None:
    base = {"url": "postgresql://h/db", "table": "t"}
    assert SinkOptions.parse(base).checkpoint_check is CheckpointMode.WARN
    parsed = SinkOptions.parse({**base, "CHECKPOINTCHECK": "Require"})
    assert parsed.checkpoint_check is CheckpointMode.REQUIRE
    with pytest.raises(ConfigError, match="checkpointCheck: unknown value 'always'"):
        SinkOptions.parse({**base, "checkpointCheck": "always"})
