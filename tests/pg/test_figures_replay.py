"""The per-batch figures against a replayed commit and old or damaged rows (found by an attack)."""

from __future__ import annotations

import json

import psycopg
import pytest

from sqlsink import cli
from sqlsink.postgres.survey import decisions as survey
from tests.pg.protocol import Writer


def test_a_replayed_commit_leaves_commit_ms_and_the_figures_agreeing(
    pg_url: str, keyed: str, sink: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replayed commit keeps the first commit's figures (figures=None) but its
    record_metrics still overwrites commit_ms and orphans: the row then says two
    different commit times for one batch (status --json: recent batches' commit_ms and
    their figures.commit_ms)."""
    writer = Writer(pg_url, keyed, sink, query_id="q-figures")
    outcomes = [writer.write(0, range(0, 5), 0)]
    writer.commit(0, list(outcomes))
    writer.commit(0, list(outcomes))  # Spark calls commit again after a driver restart
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (row,) = survey.recent_decisions(conn, sink, 1)  # type: ignore[arg-type]
    assert row.figures is not None
    capsys.readouterr()
    assert cli.main(["status", "--url", pg_url, "--sink-id", sink, "--json"]) == 0
    capsys.readouterr()
    assert row.figures.commit_ms == pytest.approx(row.commit_ms, abs=0.001), (
        f"column commit_ms {row.commit_ms} (the replay's) vs figures' {row.figures.commit_ms}"
    )


def test_status_json_with_old_rows_without_figures(
    pg_url: str, keyed: str, sink: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows from before version 9 (figures NULL) beside new ones, and a row whose
    figures a hand broke: status --json answers, figures null where unreadable."""
    writer = Writer(pg_url, keyed, sink, query_id="q-old-rows")
    for batch in range(3):
        writer.batch(batch, range(batch * 10, batch * 10 + 10))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE sqlsink.decisions SET figures = NULL WHERE sink_id = %s AND batch_id = 0",
            (sink,),
        )
        conn.execute(
            'UPDATE sqlsink.decisions SET figures = \'{"partitions": "x", "writes": 3}\' '
            "WHERE sink_id = %s AND batch_id = 2",
            (sink,),
        )
    capsys.readouterr()
    assert cli.main(["status", "--url", pg_url, "--sink-id", sink, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["sinks"][0]
    assert doc["last_batch"]["figures"] is None and doc["last_batch"]["line"] is None
    assert cli.main(["status", "--url", pg_url, "--sink-id", sink]) == 0
    assert "no figures recorded" in capsys.readouterr().out
