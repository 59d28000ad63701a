"""sqlsink.postgres.timing: off unless SQLSINK_TIMING_DIR is set; on, one JSON line per
partition with every phase it was fed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sqlsink.postgres import timing


def test_off_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(timing.ENV, raising=False)
    assert timing.begin() is None


def test_on_writes_one_line_per_partition(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(timing.ENV, str(tmp_path))
    times = timing.begin()
    assert times is not None
    assert list(times.waited(iter([1, 2, 3]))) == [1, 2, 3]
    with times.phase("encode"):
        pass
    with times.phase("encode"):
        pass
    times.save(batch=7, partition=1, rows=3)
    (path,) = tmp_path.glob("*.jsonl")
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert (record["batch"], record["partition"], record["rows"]) == (7, 1, 3)
    assert set(record["wall"]) == {"arrow_wait", "encode", "total"}
    assert set(record["cpu"]) == {"arrow_wait", "encode", "total"}
