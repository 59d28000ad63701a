"""A batch's figures in the commit log (sqlsink.decisions.figures, schema version 9):
written by the commit's own UPDATE of commit_ms, from the partitions' own timestamps and
the driver's split, and everything the driver's per-batch log line says."""

from __future__ import annotations

import json
import logging

import psycopg
import pytest

from sqlsink import cli
from sqlsink.core.model import BatchFigures
from sqlsink.postgres.survey import decisions as survey
from tests.pg.protocol import Writer


def test_a_committed_batch_keeps_its_figures_and_its_line_says_only_them(
    pg_url: str, keyed: str, sink: str, caplog: pytest.LogCaptureFixture
) -> None:
    writer = Writer(pg_url, keyed, sink, query_id="q-figures")
    outcomes = [writer.write(0, range(0, 3), 0), writer.write(0, range(3, 10), 1)]
    with caplog.at_level(logging.INFO, logger="sqlsink"):
        writer.commit(0, list(outcomes))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (row,) = survey.recent_decisions(conn, sink, 1)  # type: ignore[arg-type]
    figures = row.figures
    assert isinstance(figures, BatchFigures)
    assert (figures.partitions, figures.rows, figures.orphans) == (2, 10, 0)
    # the bytes each partition's COPY sent, summed: header and trailer (21 bytes) and each
    # row's tuple, so more than the rows alone
    sent = [o.bytes_sent for o in outcomes]
    assert all(s is not None and s > 21 for s in sent), sent
    assert figures.bytes_sent == sum(s for s in sent if s is not None)
    assert f"{figures.bytes_sent} bytes" in figures.summary()
    assert figures.commit_ms == pytest.approx(row.commit_ms, abs=0.001)  # one UPDATE wrote both
    assert [(w.partition_id, w.rows) for w in figures.writes] == [(0, 3), (1, 7)]
    for written, outcome in zip(figures.writes, outcomes, strict=True):
        # the partition's own timestamps (the column keeps milliseconds to 3 places)
        assert written.write_ms == pytest.approx(outcome.write_ms, abs=0.001)
    slowest = max(outcomes, key=lambda o: o.write_ms)
    assert figures.slowest() is not None and figures.slowest().partition_id == slowest.partition_id  # type: ignore[union-attr]
    assert figures.prepare_to_decision_ms is not None and figures.prepare_to_decision_ms >= 0
    total = figures.commit_prepared_ms + figures.completion_ms
    assert figures.commit_ms == pytest.approx(total, abs=0.002)
    assert figures.decision_ms > 0 and figures.commit_prepared_ms > 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sqlsink ")]
    assert figures.line(sink, 0) in lines  # the line is made from the figures as stored


def test_status_shows_the_last_batchs_figures(
    pg_url: str, keyed: str, sink: str, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = Writer(pg_url, keyed, sink, query_id="q-figures")
    writer.batch(0, range(0, 4), range(4, 6))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (row,) = survey.recent_decisions(conn, sink, 1)  # type: ignore[arg-type]
    assert row.figures is not None
    capsys.readouterr()
    assert cli.main(["status", "--url", pg_url, "--sink-id", sink, "--json"]) == 0
    last = json.loads(capsys.readouterr().out)["sinks"][0]["last_batch"]
    assert last["batch_id"] == 0 and last["line"] == row.figures.line(sink, 0)
    assert BatchFigures.from_json(last["figures"]) == row.figures
    assert cli.main(["status", "--url", pg_url, "--sink-id", sink]) == 0
    assert f"last batch 0: {row.figures.summary()}" in capsys.readouterr().out


def test_a_replayed_commit_keeps_the_first_commits_figures(
    pg_url: str, keyed: str, sink: str
) -> None:
    writer = Writer(pg_url, keyed, sink, query_id="q-figures")
    outcomes = [writer.write(0, range(0, 5), 0)]
    writer.commit(0, list(outcomes))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (first,) = survey.recent_decisions(conn, sink, 1)  # type: ignore[arg-type]
    writer.commit(0, list(outcomes))  # Spark calls commit again after a driver restart
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (again,) = survey.recent_decisions(conn, sink, 1)  # type: ignore[arg-type]
    assert first.figures is not None and again.figures == first.figures
